//! `strata devices`: every accelerator this build can use, with its limits and the
//! operations it runs (`--json` for scripts).

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
            "devices": list,
            "error": found.as_ref().err().map(|e| e.to_string()),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
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
