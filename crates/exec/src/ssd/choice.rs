//! Whether the SSD tier runs, and with how much memory: the one rule behind the command
//! line's `--expert-cache` and Python's `expert_cache`.

use std::path::Path;

use strata_model::memory::{MemoryPlan, available_bytes};
use strata_policy::replacement::Replacement;

use super::SsdOptions;
use crate::{Error, Result};

/// What was asked of the expert cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertCache {
    /// The tier only when the routed experts do not fit in the memory available beside the
    /// other mapped weights and [`MemoryPlan::expert_cache_reserve`], with what is left.
    #[default]
    Auto,
    /// Never: the experts stay mapped.
    Off,
    /// Slots of this many bytes, whether or not the experts would fit.
    Size(u64),
}

/// The tier's settings, and for [`ExpertCache::Auto`] why it starts.
#[derive(Debug, Clone)]
pub struct CacheChoice {
    /// Budget and replacement rule; the rest at their defaults.
    pub options: SsdOptions,
    /// Why an automatic cache starts: the sizes it was chosen from.
    pub note: Option<String>,
}

impl ExpertCache {
    /// `auto`, `off` or a size (`512M`, `8G`, `1.5GiB`, bytes); the error message starts
    /// with `s`, for the caller to prefix with the option's name.
    pub fn parse(s: &str) -> Result<ExpertCache> {
        match s {
            "auto" => Ok(ExpertCache::Auto),
            "off" => Ok(ExpertCache::Off),
            size => match strata_accel::parse_bytes(size) {
                Ok(0) => Err(Error::Config(format!("{size}: give a size, or `off`"))),
                Ok(b) => Ok(ExpertCache::Size(b)),
                Err(e) => Err(Error::Config(format!("{size}: a size, auto or off ({e})"))),
            },
        }
    }

    /// The tier's settings for the model file `file`, whose memory `plan` gives (asked only
    /// for `Auto`; its error is the only one), with replacement `rule`; `None` when no tier
    /// runs.
    pub fn choose<E>(
        self,
        file: &Path,
        rule: Replacement,
        plan: impl FnOnce() -> std::result::Result<MemoryPlan, E>,
    ) -> std::result::Result<Option<CacheChoice>, E> {
        let (budget, note) = match self {
            ExpertCache::Off => return Ok(None),
            ExpertCache::Size(b) => (b, None),
            ExpertCache::Auto => {
                let Some(available) = available_bytes().filter(|_| file.is_file()) else {
                    return Ok(None);
                };
                let plan = plan()?;
                let reserve = plan.expert_cache_reserve();
                let Some(b) = plan.expert_cache_budget(available, reserve) else {
                    return Ok(None);
                };
                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                let note = format!(
                    "the routed experts ({:.1} GiB) do not fit in the {:.1} GiB available beside \
                     the other mapped weights ({:.1} GiB) and {:.1} GiB kept back: they are read \
                     from the file into a {:.1} GiB cache (an expert cache size sets it, `off` \
                     maps them)",
                    gib(plan.mapped_experts),
                    gib(available),
                    gib(plan.mapped_weights - plan.mapped_experts),
                    gib(reserve),
                    gib(b)
                );
                (b, Some(note))
            }
        };
        Ok(Some(CacheChoice {
            options: SsdOptions {
                budget,
                replacement: rule,
                ..SsdOptions::default()
            },
            note,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_choose() {
        assert_eq!(ExpertCache::parse("auto").unwrap(), ExpertCache::Auto);
        assert_eq!(ExpertCache::parse("off").unwrap(), ExpertCache::Off);
        assert_eq!(
            ExpertCache::parse("6G").unwrap(),
            ExpertCache::Size(6 << 30)
        );
        for (bad, why) in [
            ("0", "0: give a size"),
            ("lots", "lots: a size, auto or off"),
        ] {
            let e = ExpertCache::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with(why), "{e}");
        }
        let no_plan = || -> std::result::Result<MemoryPlan, String> { Err("asked".into()) };
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let rule = Replacement::Lru;
        assert!(
            ExpertCache::Off
                .choose(&file, rule, no_plan)
                .unwrap()
                .is_none()
        );
        let c = ExpertCache::Size(1 << 20)
            .choose(&file, rule, no_plan)
            .unwrap()
            .unwrap();
        assert_eq!((c.options.budget, c.options.replacement), (1 << 20, rule));
        assert!(c.note.is_none() && c.options.prefetch);
        // Auto needs the plan only for a file that exists, and passes its error on.
        let missing = file.with_file_name("no-such-model.gguf");
        assert!(
            ExpertCache::Auto
                .choose(&missing, rule, no_plan)
                .unwrap()
                .is_none()
        );
        if available_bytes().is_some() {
            let e = ExpertCache::Auto.choose(&file, rule, no_plan).unwrap_err();
            assert_eq!(e, "asked");
        }
    }
}
