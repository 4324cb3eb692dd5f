//! The reproductions run quickly and keep the papers' directions.

use strata_sim::reproduce;

#[test]
fn reproductions_run_and_print() {
    for name in reproduce::NAMES {
        let r = reproduce::run(name).unwrap();
        assert!(!r.rows.is_empty());
        for row in &r.rows {
            assert!(row.value.is_finite() && row.value >= 0.0, "{row:?}");
            eprintln!(
                "{:<24} {:<16} {:>5} {:<36} {:>9.3} {:?}",
                row.policy, row.model, row.prompt_tokens, row.metric, row.value, row.paper
            );
        }
    }
}
