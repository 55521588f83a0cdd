//! API keys and their roles: `--api-key` (one admin key, named `api-key`) and `--keys FILE`
//! (TOML, `[[key]]` tables), the file re-read when it changes — checked at every request, so a
//! key taken out of the file fails on the next request — or on SIGHUP.
//!
//! ```toml
//! [[key]]
//! name = "checkout-app"        # who, in the audit log; default: "sha256:" and 12 hex digits
//! role = "inference"           # inference, reviewer or admin
//! key = "sk-live-..."          # or: sha256 = "<64 hex digits of the key's SHA-256>"
//! service_tier = "batch"       # optional: the default priority class of its requests
//! ```
//!
//! Invariants:
//! - no key is held in clear: each is kept as its SHA-256; a presented key is hashed and compared
//!   with every key's hash in constant time, all of them every time (no early exit), so timing
//!   tells neither which key nor how many bytes matched;
//! - a file that stops parsing (a half-written edit) leaves the keys as they were: the error is
//!   logged with the file's path, never its content, and the next change is read again;
//! - a server with neither `--api-key` nor `--keys` is open: every caller is `anonymous` with the
//!   admin role (as before keys existed).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use abserve_protocol::{Class, Role};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Who is calling: the name and role of the key presented (and its default class).
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    pub name: Arc<str>,
    pub role: Role,
    /// The class its requests run in unless they ask for one (`service_tier` of its entry).
    pub class: Option<Class>,
}

/// The name an action is recorded under (a review's `by`, an eval run's `who`): the caller's
/// key name, `anonymous` on a server without keys.
pub fn name_of(caller: Option<&Caller>) -> String {
    caller.map_or_else(
        || Caller::anonymous().name.to_string(),
        |c| c.name.to_string(),
    )
}

impl Caller {
    fn anonymous() -> Caller {
        Caller {
            name: "anonymous".into(),
            role: Role::Admin,
            class: None,
        }
    }
}

struct Key {
    caller: Caller,
    sha256: [u8; 32],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    key: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: Option<String>,
    role: Role,
    key: Option<String>,
    sha256: Option<String>,
    service_tier: Option<String>,
}

/// What identifies a version of the file: a change of any of these is read again.
#[derive(Debug, Clone, PartialEq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: m.modified().ok(),
        len: m.len(),
        inode: m.ino(),
    })
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn hex_digest(text: &str) -> Option<[u8; 32]> {
    let t = text.trim();
    if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The keys of a keys file's text. `Err` names the entry (1-based) and what is wrong, never a key.
fn parse(text: &str) -> Result<Vec<Key>, String> {
    let file: File = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let mut keys: Vec<Key> = Vec::with_capacity(file.key.len());
    for (i, e) in file.key.into_iter().enumerate() {
        let at = i + 1;
        let sha256 = match (&e.key, &e.sha256) {
            (Some(k), None) if !k.trim().is_empty() => digest(k.trim()),
            (None, Some(h)) => hex_digest(h)
                .ok_or_else(|| format!("key {at}: sha256 must be 64 hexadecimal digits"))?,
            (Some(_), Some(_)) => return Err(format!("key {at}: give key or sha256, not both")),
            _ => return Err(format!("key {at}: give key (non-empty) or sha256")),
        };
        let class = match e.service_tier.as_deref().map(Class::from_tier) {
            None => None,
            Some(Ok(c)) => c,
            Some(Err(why)) => return Err(format!("key {at}: service_tier: {why}")),
        };
        let name = e.name.unwrap_or_else(|| {
            let hex: String = sha256[..6].iter().map(|b| format!("{b:02x}")).collect();
            format!("sha256:{hex}")
        });
        if let Some(j) = keys.iter().position(|k| k.sha256 == sha256) {
            return Err(format!("key {at} is the same key as key {}", j + 1));
        }
        if let Some(j) = keys.iter().position(|k| *k.caller.name == *name) {
            return Err(format!("key {at}: the name '{name}' is key {}'s", j + 1));
        }
        keys.push(Key {
            caller: Caller {
                name: name.into(),
                role: e.role,
                class,
            },
            sha256,
        });
    }
    Ok(keys)
}

fn read(path: &Path) -> Result<Vec<Key>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the keys file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("the keys file {}: {e}", path.display()))
}

struct Loaded {
    keys: Arc<Vec<Key>>,
    stamp: Option<Stamp>,
}

/// The keys a server accepts.
pub struct Keys {
    file: Option<PathBuf>,
    /// `--api-key` (an admin key named `api-key`) first, then the file's.
    fixed: Vec<Key>,
    loaded: RwLock<Loaded>,
}

impl fmt::Debug for Keys {
    /// Counts per role, never a key or its hash.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.current();
        let all = || self.fixed.iter().chain(keys.iter());
        let count = |r: Role| all().filter(|k| k.caller.role == r).count();
        f.debug_struct("Keys")
            .field("file", &self.file)
            .field("inference", &count(Role::Inference))
            .field("reviewer", &count(Role::Reviewer))
            .field("admin", &count(Role::Admin))
            .finish()
    }
}

impl Keys {
    /// No keys: an open server.
    pub fn open() -> Keys {
        Keys {
            file: None,
            fixed: vec![],
            loaded: RwLock::new(Loaded {
                keys: Arc::new(vec![]),
                stamp: None,
            }),
        }
    }

    /// `--api-key` and `--keys FILE`; `Err` when the file cannot be read or parsed.
    pub fn new(api_key: Option<String>, file: Option<PathBuf>) -> Result<Keys, String> {
        let fixed = api_key
            .filter(|k| !k.is_empty())
            .map(|k| Key {
                caller: Caller {
                    name: "api-key".into(),
                    role: Role::Admin,
                    class: None,
                },
                sha256: digest(&k),
            })
            .into_iter()
            .collect();
        let (keys, stamp) = match &file {
            Some(p) => (read(p)?, stamp(p)),
            None => (vec![], None),
        };
        Ok(Keys {
            file,
            fixed,
            loaded: RwLock::new(Loaded {
                keys: Arc::new(keys),
                stamp,
            }),
        })
    }

    /// Whether a caller must present a key (`--api-key` or `--keys` given).
    pub fn required(&self) -> bool {
        self.file.is_some() || !self.fixed.is_empty()
    }

    fn current(&self) -> Arc<Vec<Key>> {
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys
            .clone()
    }

    /// The caller a presented key (the bearer token, `None` when absent) identifies, after
    /// reading the keys file again if it changed; `None`: refused (401).
    pub fn caller(&self, presented: Option<&str>) -> Option<Caller> {
        if !self.required() {
            return Some(Caller::anonymous());
        }
        self.refresh();
        let given = digest(presented?);
        let keys = self.current();
        let mut found: Option<&Caller> = None;
        for k in self.fixed.iter().chain(keys.iter()) {
            // every key compared, none skipped: the time does not depend on which matched
            if bool::from(k.sha256.ct_eq(&given)) {
                found = found.or(Some(&k.caller));
            }
        }
        found.cloned()
    }

    /// Reads the keys file again when its stamp changed since it was last read.
    fn refresh(&self) {
        let Some(path) = &self.file else { return };
        let now = stamp(path);
        let same = self.loaded.read().unwrap_or_else(|e| e.into_inner()).stamp == now;
        if !same {
            let _ = self.reload_at(path, now);
        }
    }

    /// Reads the keys file again (SIGHUP), whatever its stamp: the number of keys it holds.
    pub fn reload(&self) -> Result<usize, String> {
        match &self.file {
            Some(p) => self.reload_at(p, stamp(p)),
            None => Ok(0),
        }
    }

    fn reload_at(&self, path: &Path, now: Option<Stamp>) -> Result<usize, String> {
        let mut loaded = self.loaded.write().unwrap_or_else(|e| e.into_inner());
        // this version is read (or failed) once, whatever the outcome
        loaded.stamp = now;
        match read(path) {
            Ok(keys) => {
                let n = keys.len();
                loaded.keys = Arc::new(keys);
                tracing::info!("keys: read {n} keys from {}", path.display());
                Ok(n)
            }
            Err(e) => {
                tracing::error!("keys: {e}; the keys read before stay in force");
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[key]]
name = "app"
role = "inference"
key = "sk-app-0123456789"
service_tier = "flex"

[[key]]
role = "reviewer"
sha256 = "8b1a9953c4611296a827abf8c47804d7e6c49c6b5a7d4c0c4b8e5f2d1b0e6c2a"

[[key]]
name = "ops"
role = "admin"
key = "sk-admin-0123456789"
"#;

    fn temp(text: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "abserve-keys-{}-{:?}.toml",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn keys_identify_their_callers_and_nothing_else_passes() {
        let p = temp(FILE);
        let keys = Keys::new(Some("sk-cli".into()), Some(p.clone())).unwrap();
        let app = keys.caller(Some("sk-app-0123456789")).unwrap();
        assert_eq!(
            (&*app.name, app.role, app.class),
            ("app", Role::Inference, Some(Class::Batch))
        );
        assert_eq!(
            keys.caller(Some("sk-admin-0123456789")).unwrap().role,
            Role::Admin
        );
        assert_eq!(&*keys.caller(Some("sk-cli")).unwrap().name, "api-key");
        assert_eq!(keys.caller(Some("sk-app-012345678")), None);
        assert_eq!(keys.caller(Some("")), None);
        assert_eq!(keys.caller(None), None);
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn a_key_given_by_its_hash_passes_and_is_named_by_it() {
        let key = "reviewer-secret";
        let hex: String = digest(key).iter().map(|b| format!("{b:02x}")).collect();
        let p = temp(&format!(
            "[[key]]\nrole = \"reviewer\"\nsha256 = \"{hex}\"\n"
        ));
        let keys = Keys::new(None, Some(p.clone())).unwrap();
        let c = keys.caller(Some(key)).unwrap();
        assert_eq!(c.role, Role::Reviewer);
        assert_eq!(&*c.name, format!("sha256:{}", &hex[..12]));
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn a_key_taken_out_of_the_file_fails_on_the_next_call_and_a_broken_file_changes_nothing() {
        let p = temp(FILE);
        let keys = Keys::new(None, Some(p.clone())).unwrap();
        assert!(keys.caller(Some("sk-app-0123456789")).is_some());
        std::fs::write(
            &p,
            "[[key]]\nname = \"ops\"\nrole = \"admin\"\nkey = \"sk-admin-0123456789\"\n",
        )
        .unwrap();
        assert_eq!(keys.caller(Some("sk-app-0123456789")), None);
        assert!(keys.caller(Some("sk-admin-0123456789")).is_some());
        // half-written: the keys read before stay
        std::fs::write(&p, "[[key]]\nrole = \"adm").unwrap();
        assert!(keys.caller(Some("sk-admin-0123456789")).is_some());
        assert!(keys.reload().is_err());
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn bad_files_are_refused_with_the_entry_named_and_no_key_shown() {
        let cases = [
            ("[[key]]\nrole = \"owner\"\nkey = \"k\"\n", "owner"),
            ("[[key]]\nrole = \"admin\"\n", "key 1: give key"),
            ("[[key]]\nrole = \"admin\"\nkey = \"sk-x\"\nsha256 = \"00\"\n", "not both"),
            ("[[key]]\nrole = \"admin\"\nsha256 = \"abc\"\n", "64 hexadecimal"),
            ("[[key]]\nrole = \"admin\"\nkey = \"sk-x\"\n[[key]]\nrole = \"reviewer\"\nkey = \"sk-x\"\n", "key 2 is the same key as key 1"),
            ("[[key]]\nrole = \"admin\"\nkey = \"sk-x\"\nservice_tier = \"slow\"\n", "service_tier"),
            ("[[key]]\nrole = \"admin\"\nkey = \"sk-x\"\nscope = \"all\"\n", "scope"),
        ];
        for (text, says) in cases {
            let Err(e) = parse(text) else {
                panic!("{text} parsed")
            };
            assert!(e.contains(says), "{e}");
            assert!(!e.contains("sk-x"), "{e}");
        }
        let missing = Keys::new(None, Some(PathBuf::from("/nonexistent/keys.toml")));
        assert!(missing.unwrap_err().contains("/nonexistent/keys.toml"));
    }

    #[test]
    fn a_server_without_keys_is_open_and_debug_shows_no_key() {
        let open = Keys::open();
        assert_eq!(open.caller(None).unwrap().role, Role::Admin);
        let keys = Keys::new(Some("sk-secret-value".into()), None).unwrap();
        let shown = format!("{keys:?}");
        assert!(
            !shown.contains("sk-secret-value") && shown.contains("admin: 1"),
            "{shown}"
        );
    }
}
