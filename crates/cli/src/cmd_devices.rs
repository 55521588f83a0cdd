//! `abserve devices`: the devices this build of llama.cpp can use (the CPU, and GPUs of a CUDA or
//! Vulkan build), with their memory; `--device NAME` picks one to offload to.

use clap::Args;

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// One JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: DevicesArgs) -> anyhow::Result<()> {
    let devices = abserve_engine::device::list();
    if a.json {
        let v: Vec<serde_json::Value> = devices
            .iter()
            .map(|(d, kind)| {
                let mut v = serde_json::to_value(d).unwrap_or_default();
                v["kind"] = serde_json::Value::from(*kind);
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<12} {:<8} {:<6} {:>14} {:>14}  description",
        "name", "backend", "kind", "total", "free"
    );
    for (d, kind) in &devices {
        println!(
            "{:<12} {:<8} {:<6} {:>14} {:>14}  {}",
            d.name,
            d.backend,
            kind,
            abserve_engine::plan::human_bytes(d.total_bytes),
            abserve_engine::plan::human_bytes(d.free_bytes),
            d.description
        );
    }
    if !devices.iter().any(|(_, k)| *k != "cpu") {
        let built: Vec<&str> = [
            (cfg!(feature = "cuda"), "CUDA"),
            (cfg!(feature = "vulkan"), "Vulkan"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if built.is_empty() {
            println!("\nno GPU: this is a CPU build (cargo build --release --features cuda, or vulkan, for one)");
        } else {
            println!(
                "\nno GPU: this build has llama.cpp's {} backend, and it found no device (its log line above says why, e.g. no driver)",
                built.join(" and ")
            );
        }
    }
    Ok(())
}
