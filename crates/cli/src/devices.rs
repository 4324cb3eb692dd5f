//! `strata devices`: the CPU's kernel path and memory, and every accelerator this build can
//! use, with its limits and the operations it runs (`--json` for scripts).

use clap::Args;

/// Arguments of `strata devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
}

/// The CPU's model name (`/proc/cpuinfo`, Linux), if it can be read.
fn cpu_name() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_owned())
}

/// The CPU as the kernels see it.
struct Cpu {
    name: Option<String>,
    threads: usize,
    kernels: &'static str,
    available: Vec<&'static str>,
    int8_unit: &'static str,
    bf16_unit: &'static str,
    memory_available: Option<u64>,
}

impl Cpu {
    fn detect() -> Self {
        use strata_kernels::Isa;
        let (int8_unit, bf16_unit) = strata_kernels::isa::units();
        Cpu {
            name: cpu_name(),
            threads: strata_kernels::num_threads(),
            kernels: Isa::selected().name(),
            available: Isa::available().iter().map(|i| i.name()).collect(),
            int8_unit,
            bf16_unit,
            memory_available: strata_model::memory::available_bytes(),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "threads": self.threads,
            "kernels": self.kernels,
            "available": self.available,
            "int8_unit": self.int8_unit,
            "bf16_unit": self.bf16_unit,
            "memory_available": self.memory_available,
        })
    }
}

pub fn run(args: DevicesArgs) -> anyhow::Result<()> {
    let found = strata_accel::devices();
    if args.json {
        let list = match &found {
            Ok(devs) => devs
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "index": d.index,
                        "name": d.name,
                        "backend": d.backend,
                        "type": d.device_type,
                        "driver": d.driver,
                        "memory": d.memory,
                        "max_binding": d.max_binding,
                        "max_buffer": d.max_buffer,
                        "shader_f16": d.shader_f16,
                        "subgroups": d.subgroups,
                        "ops": d.ops.iter().map(|o| o.to_string()).collect::<Vec<_>>(),
                    })
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let out = serde_json::json!({
            "cpu": Cpu::detect().json(),
            "devices": list,
            "error": found.as_ref().err().map(|e| e.to_string()),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    let cpu = Cpu::detect();
    let name = cpu.name.as_deref().unwrap_or("unknown");
    outln!("cpu  {name} ({} threads)", cpu.threads)?;
    outln!(
        "  kernels      {} (available: {}; `STRATA_KERNEL` picks one)",
        cpu.kernels,
        cpu.available.join(" ")
    )?;
    outln!("  int8         {}", cpu.int8_unit)?;
    outln!("  bf16         {}", cpu.bf16_unit)?;
    outln!(
        "  memory       {} available",
        cpu.memory_available.map_or("unknown".to_string(), mib)
    )?;
    match found {
        Err(e) => outln!("no accelerator: {e}")?,
        Ok(devs) => {
            for d in devs {
                outln!("gpu:{}  {}", d.index, d.name)?;
                outln!("  backend      {} ({})", d.backend, d.device_type)?;
                outln!("  driver       {}", d.driver)?;
                outln!(
                    "  memory       {}",
                    d.memory.map_or("not reported by the API".to_string(), mib)
                )?;
                outln!("  max binding  {}", mib(d.max_binding))?;
                outln!("  max buffer   {}", mib(d.max_buffer))?;
                outln!(
                    "  features     shader-f16 {}, subgroups {}",
                    if d.shader_f16 { "yes" } else { "no" },
                    if d.subgroups { "yes" } else { "no" }
                )?;
                let ops: Vec<String> = d.ops.iter().map(|o| o.to_string()).collect();
                outln!("  ops          {}", ops.join(" "))?;
            }
        }
    }
    Ok(())
}
