//! Property-based fuzzing of the GGUF header reader, which parses untrusted files: whatever the
//! bytes, it returns a header or an error — never a panic, never memory out of proportion to
//! the input. Fixed seeds and a fixed number of cases keep the run bounded and repeatable.

use abserve_engine::gguf::GgufHeader;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config(cases: u32, seed: u64) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The default model's header and tensor table (the bytes before its tensor data).
fn real_header() -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let h = GgufHeader::read(&path).expect("default model missing: run scripts/setup.sh");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(h.data_offset as usize);
    bytes
}

const MAGIC: &[u8] = b"GGUF";

/// A small well-formed header: `kv` string pairs and `tensors` F32 tensors of `dims`.
fn header(kv: &[(String, String)], tensors: &[(String, Vec<u64>)]) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    for (k, v) in kv {
        s(&mut b, k);
        b.extend(8u32.to_le_bytes());
        s(&mut b, v);
    }
    let mut offset = 0u64;
    for (name, dims) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(0u32.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offset += dims.iter().product::<u64>() * 4;
    }
    let aligned = b.len().div_ceil(32) * 32;
    b.resize(aligned + offset as usize, 0);
    b
}

proptest! {
    #![proptest_config(config(3000, 0xab5e))]
    #[test]
    fn any_bytes_give_a_header_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = GgufHeader::from_bytes(&bytes, "fuzz");
    }

    #[test]
    fn any_bytes_after_a_valid_start_give_a_header_or_an_error(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = MAGIC.to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(tail);
        let _ = GgufHeader::from_bytes(&bytes, "fuzz");
    }
}

proptest! {
    #![proptest_config(config(1000, 0x99f))]
    #[test]
    fn well_formed_headers_read_back_and_every_mutation_is_an_error_or_a_header(
        kv in proptest::collection::vec(("[a-z.]{1,12}", "[ -~]{0,20}"), 0..6),
        dims in proptest::collection::vec(proptest::collection::vec(1u64..16, 1..4), 0..4),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let tensors: Vec<(String, Vec<u64>)> = dims.into_iter().enumerate().map(|(i, d)| (format!("t{i}"), d)).collect();
        let bytes = header(&kv, &tensors);
        let h = GgufHeader::from_bytes(&bytes, "ok").unwrap();
        prop_assert_eq!(h.tensors.len(), tensors.len());
        for (k, v) in &kv {
            // the last of duplicate keys wins
            let last = kv.iter().rev().find(|(k2, _)| k2 == k).unwrap();
            prop_assert_eq!(h.str(k), Some(last.1.as_str()), "{} = {}", k, v);
        }
        let mut bad = bytes.clone();
        for (i, x) in &flips {
            let at = i.index(bad.len());
            bad[at] = *x;
        }
        let _ = GgufHeader::from_bytes(&bad, "fuzz");
        let _ = GgufHeader::from_bytes(&bad[..cut.index(bad.len())], "fuzz");
    }
}

proptest! {
    #![proptest_config(config(200, 0x5eed))]
    #[test]
    fn mutations_of_the_default_models_header_give_a_header_or_an_error(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..5),
        cut in any::<prop::sample::Index>(),
    ) {
        thread_local!(static REAL: Vec<u8> = real_header());
        REAL.with(|real| {
            let mut bad = real.clone();
            for (i, x) in &flips {
                // most flips land in the vocabulary; aim a quarter at the first 4 KiB, where the
                // counts and lengths are
                let at = if x % 4 == 0 { i.index(bad.len().min(4096)) } else { i.index(bad.len()) };
                bad[at] = *x;
            }
            let _ = GgufHeader::from_bytes(&bad, "fuzz");
            let _ = GgufHeader::from_bytes(&bad[..cut.index(bad.len())], "fuzz");
        });
    }
}
