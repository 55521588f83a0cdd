//! Accelerator devices (CUDA, Vulkan, Metal GPUs) as the memory plan and readiness see them:
//! a name, a backend, total and free memory. The real ones come from ggml's device list; a
//! [`FakeDevice`] stands in for one in tests on machines without a GPU, so the device side of
//! the plan, of admission and of `/ready` is exercised everywhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use crate::plan::DeviceMemory;

/// A device whose memory can be read at any time (for the plan before loading, for `/ready` and
/// `/metrics` while serving).
pub trait Device: Send + Sync {
    fn memory(&self) -> DeviceMemory;
    /// ggml's device index, to place the model on it; `None` for a fake.
    fn ggml_index(&self) -> Option<usize>;
}

/// A device of ggml's list (a GPU build: CUDA or Vulkan).
pub struct GgmlDevice {
    index: usize,
}

impl Device for GgmlDevice {
    fn memory(&self) -> DeviceMemory {
        let _ = crate::llama::backend();
        llama_cpp_2::list_llama_ggml_backend_devices()
            .into_iter()
            .find(|d| d.index == self.index)
            .map(memory_of)
            .unwrap_or_else(|| DeviceMemory {
                name: format!("device {}", self.index),
                description: "gone".into(),
                backend: "?".into(),
                total_bytes: 0,
                free_bytes: 0,
            })
    }

    fn ggml_index(&self) -> Option<usize> {
        Some(self.index)
    }
}

fn memory_of(d: llama_cpp_2::LlamaBackendDevice) -> DeviceMemory {
    DeviceMemory {
        name: d.name,
        description: d.description,
        backend: d.backend,
        total_bytes: d.memory_total as u64,
        free_bytes: d.memory_free as u64,
    }
}

/// Every device ggml knows in this build, with its kind (`cpu`, `gpu`, `igpu`, `accel`).
pub fn list() -> Vec<(DeviceMemory, &'static str)> {
    let _ = crate::llama::backend();
    llama_cpp_2::list_llama_ggml_backend_devices()
        .into_iter()
        .map(|d| {
            use llama_cpp_2::LlamaBackendDeviceType as T;
            let kind = match d.device_type {
                T::Cpu => "cpu",
                T::Gpu => "gpu",
                T::IntegratedGpu => "igpu",
                T::Accelerator => "accel",
                _ => "unknown",
            };
            (memory_of(d), kind)
        })
        .collect()
}

/// The GPU to offload to: the one named `name`, else the first GPU; `None` when the build has
/// none (a CPU build), which means no offload.
pub fn find(name: Option<&str>) -> Result<Option<Arc<dyn Device>>, String> {
    let _ = crate::llama::backend();
    let gpus: Vec<_> = llama_cpp_2::list_llama_ggml_backend_devices()
        .into_iter()
        .filter(|d| !matches!(d.device_type, llama_cpp_2::LlamaBackendDeviceType::Cpu))
        .collect();
    match name {
        Some(n) => match gpus.iter().find(|d| d.name == n) {
            Some(d) => Ok(Some(Arc::new(GgmlDevice { index: d.index }))),
            None => Err(format!(
                "no device named '{n}' (this build has: {}; `abserve devices` lists them)",
                if gpus.is_empty() {
                    "none, it is a CPU build".to_string()
                } else {
                    gpus.iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )),
        },
        None => Ok(gpus
            .first()
            .map(|d| Arc::new(GgmlDevice { index: d.index }) as Arc<dyn Device>)),
    }
}

/// A device for tests: a fixed size, and memory in use that the test sets.
pub struct FakeDevice {
    pub name: String,
    pub backend: String,
    pub total_bytes: u64,
    used: AtomicU64,
}

impl FakeDevice {
    pub fn new(name: &str, total_bytes: u64, used_bytes: u64) -> FakeDevice {
        FakeDevice {
            name: name.into(),
            backend: "Fake".into(),
            total_bytes,
            used: AtomicU64::new(used_bytes),
        }
    }

    /// A device that only answers "what if" (`abserve plan --device-memory` without a GPU).
    pub fn hypothetical(total_bytes: u64) -> FakeDevice {
        FakeDevice {
            backend: "hypothetical".into(),
            ..FakeDevice::new("hypothetical", total_bytes, 0)
        }
    }

    pub fn set_used(&self, bytes: u64) {
        self.used
            .store(bytes.min(self.total_bytes), Ordering::SeqCst);
    }
}

impl Device for FakeDevice {
    fn memory(&self) -> DeviceMemory {
        let used = self.used.load(Ordering::SeqCst);
        DeviceMemory {
            name: self.name.clone(),
            description: format!("{} device", self.backend),
            backend: self.backend.clone(),
            total_bytes: self.total_bytes,
            free_bytes: self.total_bytes - used,
        }
    }

    fn ggml_index(&self) -> Option<usize> {
        None
    }
}
