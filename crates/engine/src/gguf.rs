//! Reads a GGUF file's header (metadata and tensor table) without loading any weights.
//!
//! The memory plan must be made *before* llama.cpp maps the model, so that a model that cannot
//! fit is refused with numbers instead of crashing half-way through loading. The header is
//! small (kilobytes to a few megabytes for the vocabulary), so `abserve plan` answers in well
//! under a second. Every read is bounds-checked: a truncated or corrupt file gives a
//! [`GgufError`], never a panic or a huge allocation.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// Little-endian "GGUF".
const MAGIC: u32 = 0x4655_4747;
/// Upper bounds that no real model reaches; they turn garbage lengths into clean errors.
const MAX_STRING: u64 = 64 << 20;
const MAX_ARRAY: u64 = 16 << 20;
const MAX_ENTRIES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open model file {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a GGUF file (bad magic {magic:#010x})")]
    BadMagic { path: String, magic: u32 },
    #[error("{path}: unsupported GGUF version {version}")]
    Version { path: String, version: u32 },
    #[error("{path}: corrupt or truncated GGUF header: {what}")]
    Corrupt { path: String, what: String },
    #[error("{path}: missing metadata key {key}")]
    MissingKey { path: String, key: String },
    #[error("{path}: tensor data ends at byte {end} but the file has {size} bytes (truncated?)")]
    Truncated { path: String, end: u64, size: u64 },
}

/// One metadata value. Arrays keep their length and, for strings, the first elements are not
/// kept (the vocabulary would cost megabytes); numeric arrays are kept for per-layer values.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// Numeric array values (as i64) or, for other element types, just the length.
    Array {
        len: u64,
        ints: Vec<i64>,
    },
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Uint(v) => Some(*v),
            Value::Int(v) if *v >= 0 => Some(*v as u64),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub offset: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone)]
pub struct GgufHeader {
    pub path: String,
    pub version: u32,
    pub file_size: u64,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Byte offset in the file where tensor data starts.
    pub data_offset: u64,
}

/// (elements per block, bytes per block) of each ggml type, as in ggml's type traits.
pub fn ggml_type_block(t: u32) -> Option<(u64, u64)> {
    Some(match t {
        0 => (1, 4),     // F32
        1 => (1, 2),     // F16
        2 => (32, 18),   // Q4_0
        3 => (32, 20),   // Q4_1
        6 => (32, 22),   // Q5_0
        7 => (32, 24),   // Q5_1
        8 => (32, 34),   // Q8_0
        9 => (32, 36),   // Q8_1
        10 => (256, 84), // Q2_K
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        15 => (256, 292),
        16 => (256, 66), // IQ2_XXS
        17 => (256, 74),
        18 => (256, 98),
        19 => (256, 50),
        20 => (32, 18), // IQ4_NL
        21 => (256, 110),
        22 => (256, 82),
        23 => (256, 136),
        24 => (1, 1), // I8
        25 => (1, 2),
        26 => (1, 4),
        27 => (1, 8),
        28 => (1, 8), // F64
        29 => (256, 56),
        30 => (1, 2), // BF16
        34 => (256, 54),
        35 => (256, 66),
        39 => (32, 17), // MXFP4
        _ => return None,
    })
}

struct Reader<R> {
    inner: R,
    path: String,
}

impl<R: Read> Reader<R> {
    /// One entry of the tensor table: name, shape, type, offset, and its size in bytes (checked:
    /// a known type, at most 8 dimensions, a shape whose size does not overflow).
    fn tensor_info(&mut self) -> Result<TensorInfo, GgufError> {
        let name = self.string()?;
        let n_dims = self.u32()?;
        if n_dims > 8 {
            return Err(self.corrupt(format!("tensor {name} has {n_dims} dimensions")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64()?);
        }
        let ggml_type = self.u32()?;
        let offset = self.u64()?;
        let (blk, size) = ggml_type_block(ggml_type)
            .ok_or_else(|| self.corrupt(format!("tensor {name} has unknown type {ggml_type}")))?;
        let elems = dims.iter().try_fold(1u64, |a, d| a.checked_mul(*d));
        let bytes = elems
            .filter(|e| e % blk == 0)
            .and_then(|e| (e / blk).checked_mul(size))
            .ok_or_else(|| self.corrupt(format!("tensor {name} has impossible shape {dims:?}")))?;
        Ok(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            bytes,
        })
    }

    fn corrupt(&self, what: impl Into<String>) -> GgufError {
        GgufError::Corrupt {
            path: self.path.clone(),
            what: what.into(),
        }
    }
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .map_err(|_| self.corrupt("unexpected end of file"))?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn skip(&mut self, n: u64) -> Result<(), GgufError> {
        let copied = std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink())
            .map_err(|_| self.corrupt("unexpected end of file"))?;
        if copied != n {
            return Err(self.corrupt("unexpected end of file"));
        }
        Ok(())
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        if len > MAX_STRING {
            return Err(self.corrupt(format!("string length {len} is implausible")));
        }
        // grown as bytes arrive: a forged length costs no more memory than the file holds
        let mut buf = Vec::new();
        (&mut self.inner)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(|_| self.corrupt("unexpected end of file"))?;
        if buf.len() as u64 != len {
            return Err(self.corrupt("unexpected end of file"));
        }
        String::from_utf8(buf).map_err(|_| self.corrupt("string is not UTF-8"))
    }
    fn scalar(&mut self, ty: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::Uint(self.bytes::<1>()?[0] as u64),
            1 => Value::Int(self.bytes::<1>()?[0] as i8 as i64),
            2 => Value::Uint(u16::from_le_bytes(self.bytes()?) as u64),
            3 => Value::Int(i16::from_le_bytes(self.bytes()?) as i64),
            4 => Value::Uint(self.u32()? as u64),
            5 => Value::Int(i32::from_le_bytes(self.bytes()?) as i64),
            6 => Value::Float(f32::from_le_bytes(self.bytes()?) as f64),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            10 => Value::Uint(self.u64()?),
            11 => Value::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes()?)),
            other => return Err(self.corrupt(format!("unknown metadata type {other}"))),
        })
    }
    fn value(&mut self, ty: u32) -> Result<Value, GgufError> {
        if ty != 9 {
            return self.scalar(ty);
        }
        let elem = self.u32()?;
        let len = self.u64()?;
        if len > MAX_ARRAY {
            return Err(self.corrupt(format!("array length {len} is implausible")));
        }
        let mut ints = Vec::new();
        for _ in 0..len {
            match elem {
                8 => {
                    let l = self.u64()?;
                    if l > MAX_STRING {
                        return Err(self.corrupt("string length in array is implausible"));
                    }
                    self.skip(l)?;
                }
                9 => return Err(self.corrupt("nested arrays are not supported")),
                _ => match self.scalar(elem)? {
                    Value::Uint(v) => ints.push(v as i64),
                    Value::Int(v) => ints.push(v),
                    _ => {}
                },
            }
        }
        Ok(Value::Array { len, ints })
    }
}

impl GgufHeader {
    pub fn read(path: &Path) -> Result<Self, GgufError> {
        let p = path.display().to_string();
        let file = File::open(path).map_err(|e| GgufError::Open {
            path: p.clone(),
            source: e,
        })?;
        let file_size = file
            .metadata()
            .map_err(|e| GgufError::Open {
                path: p.clone(),
                source: e,
            })?
            .len();
        Self::parse(BufReader::with_capacity(1 << 20, file), file_size, p)
    }

    /// Reads a header from bytes (the whole file, or at least its header and tensor table;
    /// `file_size` is `bytes.len()`). The reader takes untrusted input: any bytes give a header
    /// or an error, never a panic, and memory stays proportional to the bytes.
    pub fn from_bytes(bytes: &[u8], label: &str) -> Result<Self, GgufError> {
        Self::parse(
            std::io::Cursor::new(bytes),
            bytes.len() as u64,
            label.to_string(),
        )
    }

    fn parse(inner: impl Read + Seek, file_size: u64, p: String) -> Result<Self, GgufError> {
        let mut r = Reader {
            inner,
            path: p.clone(),
        };
        let magic = r.u32().map_err(|_| GgufError::BadMagic {
            path: p.clone(),
            magic: 0,
        })?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { path: p, magic });
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version { path: p, version });
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        if n_tensors > MAX_ENTRIES || n_kv > MAX_ENTRIES {
            return Err(r.corrupt(format!("{n_tensors} tensors / {n_kv} keys is implausible")));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let v = r.value(ty)?;
            metadata.insert(key, v);
        }
        // capacity from what the file can hold (a tensor entry is at least 24 bytes), not from its word
        // capacity from what the file can hold (a tensor entry is at least 24 bytes), not from its word
        let mut tensors = Vec::with_capacity((n_tensors as usize).min(file_size as usize / 24));
        for _ in 0..n_tensors {
            tensors.push(r.tensor_info()?);
        }
        let pos = r
            .inner
            .stream_position()
            .map_err(|_| r.corrupt("cannot read position"))?;
        let align = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32)
            .max(1);
        let data_offset = pos.div_ceil(align) * align;
        let header = GgufHeader {
            path: p,
            version,
            file_size,
            metadata,
            tensors,
            data_offset,
        };
        let end = header
            .tensors
            .iter()
            .map(|t| data_offset.saturating_add(t.offset).saturating_add(t.bytes))
            .max()
            .unwrap_or(data_offset);
        if end > file_size {
            return Err(GgufError::Truncated {
                path: header.path,
                end,
                size: file_size,
            });
        }
        let _ = r.inner.seek(SeekFrom::Start(0));
        Ok(header)
    }

    pub fn weights_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// Bytes of weights llama.cpp places on a device with `gpu_layers` offloaded of `n_layer`:
    /// the last layers' tensors (`blk.N.*`, N ≥ n_layer − gpu_layers); with more than `n_layer`,
    /// also the output layer (`output*`), which for a model with tied embeddings is a copy of
    /// `token_embd` (the input embeddings themselves always stay on the host).
    pub fn offloaded_bytes(&self, n_layer: u64, gpu_layers: u64) -> u64 {
        let first = n_layer.saturating_sub(gpu_layers);
        let layer = |name: &str| {
            name.strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|n| n.parse::<u64>().ok())
        };
        let mut bytes: u64 = self
            .tensors
            .iter()
            .filter(|t| layer(&t.name).is_some_and(|i| i >= first))
            .map(|t| t.bytes)
            .sum();
        if gpu_layers > n_layer {
            let output: Vec<_> = self
                .tensors
                .iter()
                .filter(|t| t.name.starts_with("output"))
                .collect();
            bytes += output.iter().map(|t| t.bytes).sum::<u64>();
            if !output.iter().any(|t| t.name == "output.weight") {
                bytes += self
                    .tensors
                    .iter()
                    .filter(|t| t.name == "token_embd.weight")
                    .map(|t| t.bytes)
                    .sum::<u64>();
            }
        }
        bytes
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }

    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.str("general.architecture")
            .ok_or_else(|| GgufError::MissingKey {
                path: self.path.clone(),
                key: "general.architecture".into(),
            })
    }

    /// An architecture-scoped number like `llama.block_count`; per-layer arrays give their max.
    pub fn arch_u64(&self, suffix: &str) -> Result<u64, GgufError> {
        let key = format!("{}.{suffix}", self.architecture()?);
        match self.metadata.get(&key) {
            Some(Value::Array { ints, .. }) if !ints.is_empty() => {
                Some(ints.iter().copied().max().unwrap_or(0).max(0) as u64)
            }
            Some(v) => v.as_u64(),
            None => None,
        }
        .ok_or(GgufError::MissingKey {
            path: self.path.clone(),
            key,
        })
    }

    pub fn arch_u64_opt(&self, suffix: &str) -> Option<u64> {
        self.arch_u64(suffix).ok()
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.str("tokenizer.chat_template")
    }

    pub fn vocab_size(&self) -> Option<u64> {
        match self.metadata.get("tokenizer.ggml.tokens") {
            Some(Value::Array { len, .. }) => Some(*len),
            _ => None,
        }
    }
}

/// The model shape numbers the memory plan needs, read from a header.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ModelShape {
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_embd: u64,
    pub head_dim_k: u64,
    pub head_dim_v: u64,
    pub n_vocab: u64,
    pub n_ctx_train: u64,
}

impl ModelShape {
    pub fn from_header(h: &GgufHeader) -> Result<Self, GgufError> {
        let n_layer = h.arch_u64("block_count")?;
        let n_head = h.arch_u64("attention.head_count")?;
        let n_head_kv = h.arch_u64_opt("attention.head_count_kv").unwrap_or(n_head);
        let n_embd = h.arch_u64("embedding_length")?;
        if n_head == 0 || n_layer == 0 {
            return Err(GgufError::Corrupt {
                path: h.path.clone(),
                what: "zero layers or heads".into(),
            });
        }
        let head_dim = n_embd / n_head;
        Ok(ModelShape {
            n_layer,
            n_head,
            n_head_kv,
            n_embd,
            head_dim_k: h.arch_u64_opt("attention.key_length").unwrap_or(head_dim),
            head_dim_v: h.arch_u64_opt("attention.value_length").unwrap_or(head_dim),
            n_vocab: h.vocab_size().unwrap_or(32000),
            n_ctx_train: h.arch_u64_opt("context_length").unwrap_or(4096),
        })
    }
}
