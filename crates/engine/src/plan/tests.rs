//! The plan's arithmetic on a 70B-class shape (80 layers, 8 KV heads).

use super::*;

fn shape() -> ModelShape {
    ModelShape {
        n_layer: 80,
        n_head: 64,
        n_head_kv: 8,
        n_embd: 8192,
        head_dim_k: 128,
        head_dim_v: 128,
        n_vocab: 128256,
        n_ctx_train: 8192,
    }
}

fn req(weights: u64, total: u64) -> PlanRequest {
    PlanRequest {
        weights_bytes: weights,
        adapter_bytes: 0,
        shape: shape(),
        kv_type: KvType::F16,
        memory_total: total,
        budget: Budget::Fraction(1.0),
        margin: 0.10,
        context: 4096,
        n_batch: 512,
        max_sequences: 256,
        kv_cells_cap: None,
        flash_attention: false,
        kv_unified: true,
        prefix_store: None,
        offload: None,
        lanes: 1,
        draft: None,
    }
}

#[test]
fn parses_sizes() {
    assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
    assert_eq!(parse_bytes("512MB").unwrap(), 512_000_000);
    assert_eq!(parse_bytes("1000").unwrap(), 1000);
    assert_eq!(parse_bytes("1.5G").unwrap(), 3 << 29);
    assert!(parse_bytes("12 furlongs").is_err());
    assert!(parse_bytes("-5").is_err());
    assert_eq!("50%".parse::<Budget>().unwrap(), Budget::Fraction(0.5));
    assert!("0%".parse::<Budget>().is_err());
    assert!("150%".parse::<Budget>().is_err());
}

#[test]
fn kv_formula() {
    let p = MemoryPlan::new(&req(1 << 30, 96 << 30));
    assert_eq!(p.kv_bytes_per_token, 2 * 80 * 8 * 128 * 2);
    let mut r = req(1 << 30, 96 << 30);
    r.kv_type = KvType::Q8_0;
    assert_eq!(
        MemoryPlan::new(&r).kv_bytes_per_token,
        2 * 80 * 8 * 128 / 32 * 34
    );
}

#[test]
fn problem_statement_one_copy_fits_two_do_not() {
    let p = MemoryPlan::new(&req(82_208_358_400, 96 << 30));
    assert!(p.fits);
    assert_eq!(p.copies_that_fit, 1);
    assert!(p.full_context_sequences >= 1);
    // twice the weights cannot fit at all
    let p2 = MemoryPlan::new(&req(2 * 82_208_358_400, 96 << 30));
    assert!(!p2.fits);
    assert!(p2.check_fits().is_err());
}

#[test]
fn kv_cells_never_exceed_usable() {
    for budget in [200u64 << 20, 1 << 30, 8 << 30] {
        let mut r = req(100 << 20, budget);
        r.shape = super::split::tests::smollm2_shape();
        let p = MemoryPlan::new(&r);
        for fa in [false, true] {
            r.flash_attention = fa;
            let p = MemoryPlan::new(&r);
            if p.fits {
                assert!(p.planned_bytes <= p.usable_bytes, "{p:?}");
            }
        }
        if p.fits {
            assert!(p.planned_bytes <= p.usable_bytes);
            assert_eq!(p.kv_cells % KV_PAD, 0);
        }
    }
}

#[test]
fn split_streams_give_every_slot_a_fixed_padded_stream() {
    let small = |budget: u64, context: u64, slots: u64| {
        let mut r = req(100 << 20, budget);
        r.shape = super::split::tests::smollm2_shape();
        r.kv_unified = false;
        r.flash_attention = true;
        r.context = context;
        r.max_sequences = slots;
        MemoryPlan::new(&r)
    };
    for (budget, context, slots) in [
        (1u64 << 30, 1000, 64),
        (512 << 20, 512, 8),
        (600 << 20, 2048, 256),
        (8 << 30, 300, 16),
    ] {
        let p = small(budget, context, slots);
        assert_eq!(p.kv_cells_per_slot, context.div_ceil(256) * 256);
        assert_eq!(p.kv_cells, p.seq_slots * p.kv_cells_per_slot, "{p:?}");
        assert_eq!(p.full_context_sequences, p.seq_slots);
        assert!(p.seq_slots <= slots);
        assert!(p.fits && p.planned_bytes <= p.usable_bytes, "{p:?}");
    }
    // 16 slots asked, the budget holds fewer: slots shrink, never the per-slot stream
    let p = small(300 << 20, 2048, 16);
    assert!(p.seq_slots < 16 && p.seq_slots >= 1, "{p:?}");
    // not one stream fits: refused with every number
    let p = small(150 << 20, 8192, 4);
    assert!(!p.fits);
    assert!(p.check_fits().is_err());
}

#[test]
fn a_draft_model_takes_its_weights_kv_and_compute_from_the_same_budget() {
    let total = 64u64 << 30;
    let plain = MemoryPlan::new(&req(40 << 30, total));
    // a draft of 8 of the 80 layers: a tenth of the KV per token, its own weights and compute
    let draft = DraftRequest {
        weights_bytes: 4 << 30,
        shape: ModelShape {
            n_layer: 8,
            ..shape()
        },
    };
    let with = MemoryPlan::new(&PlanRequest {
        draft: Some(draft),
        ..req(40 << 30, total)
    });
    assert_eq!(with.draft_weights_bytes, 4 << 30);
    assert_eq!(with.draft_kv_bytes_per_token * 10, plain.kv_bytes_per_token);
    assert_eq!(
        with.kv_bytes_per_token,
        plain.kv_bytes_per_token + with.draft_kv_bytes_per_token
    );
    assert!(with.compute_bytes > plain.compute_bytes);
    assert!(
        with.kv_cells < plain.kv_cells,
        "the draft leaves fewer cells"
    );
    assert!(with.planned_bytes <= with.usable_bytes && with.fits);
    // one that does not fit counts the draft's weights in what it needed
    let tight = MemoryPlan::new(&PlanRequest {
        draft: Some(DraftRequest {
            weights_bytes: 20 << 30,
            ..draft
        }),
        ..req(40 << 30, total)
    });
    let e = tight.check_fits().unwrap_err();
    assert_eq!(e.weights, 60 << 30);
    assert!(e.need > e.usable);
}
