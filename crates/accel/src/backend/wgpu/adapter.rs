//! Finding adapters: which graphics APIs this build searches, the adapters they offer
//! (real GPUs first) and what each one can do.

use crate::device::{DeviceInfo, OpKind, WeightType};
use crate::{Error, Result};

/// Graphics APIs this build searches.
fn backends() -> wgpu::Backends {
    let mut b = wgpu::Backends::VULKAN;
    if cfg!(feature = "metal") {
        b |= wgpu::Backends::METAL;
    }
    if cfg!(feature = "dx12") {
        b |= wgpu::Backends::DX12;
    }
    b
}

fn api_names() -> String {
    let mut names = vec!["Vulkan"];
    if cfg!(feature = "metal") {
        names.push("Metal");
    }
    if cfg!(feature = "dx12") {
        names.push("DX12");
    }
    names.join("/")
}

/// Every adapter of the compiled-in APIs, best first.
pub(super) fn adapters() -> Result<Vec<wgpu::Adapter>> {
    if wgpu::Instance::enabled_backend_features().is_empty() {
        return Err(Error::NoAdapter {
            apis: api_names(),
            hint: "this platform has none of the compiled-in graphics APIs (enable the `metal` or `dx12` feature)",
        });
    }
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends();
    let instance = wgpu::Instance::new(desc);
    let mut found = pollster::block_on(instance.enumerate_adapters(backends()));
    // Real GPUs first: device 0 is the best one even when lavapipe is installed too.
    found.sort_by_key(|a| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    });
    if found.is_empty() {
        return Err(Error::NoAdapter {
            apis: api_names(),
            hint: "install a Vulkan driver (Debian/Ubuntu: `apt install mesa-vulkan-drivers` gives lavapipe, a CPU implementation)",
        });
    }
    Ok(found)
}

pub(super) fn info_of(index: usize, adapter: &wgpu::Adapter) -> DeviceInfo {
    let a = adapter.get_info();
    let limits = adapter.limits();
    let features = adapter.features();
    let ops = [
        OpKind::RmsNorm,
        OpKind::Rope,
        OpKind::Attention,
        OpKind::MlaAttention,
        OpKind::SiluMul,
        OpKind::Add,
        OpKind::TopK,
        OpKind::MoeCombine,
        OpKind::MoeGroup,
        OpKind::CacheStore,
        OpKind::CopyColumns,
        OpKind::FmaPeak,
    ]
    .into_iter()
    .chain(
        WeightType::ALL
            .iter()
            .flat_map(|&t| [OpKind::Embed(t), OpKind::Matmul(t), OpKind::ExpertFfn(t)]),
    )
    .collect();
    DeviceInfo {
        index,
        name: a.name,
        backend: format!("wgpu/{:?}", a.backend),
        device_type: format!("{:?}", a.device_type),
        driver: format!("{} {}", a.driver, a.driver_info).trim().to_string(),
        memory: None,
        max_binding: limits.max_storage_buffer_binding_size,
        max_buffer: limits.max_buffer_size,
        shader_f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups: features.contains(wgpu::Features::SUBGROUP),
        ops,
    }
}

/// Every adapter of the compiled-in APIs.
pub fn enumerate() -> Result<Vec<DeviceInfo>> {
    Ok(adapters()?
        .iter()
        .enumerate()
        .map(|(i, a)| info_of(i, a))
        .collect())
}
