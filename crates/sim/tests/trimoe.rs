//! The TriMoE reproduction's shape and sanity, and its policies under the simulator's
//! checks (paper numbers are compared in the reproduction's own output, not asserted).

use strata_sim::reproduce;

#[test]
fn trimoe_reproduction_rows_are_sane() {
    let r = reproduce::run("trimoe").unwrap();
    assert_eq!(r.reproduce, "trimoe");
    for row in &r.rows {
        eprintln!(
            "{:<28} {:<16} {:>4} {:<45} {:>10.4} {:?}",
            row.policy, row.model, row.batch, row.metric, row.value, row.paper
        );
    }
    for row in &r.rows {
        assert!(row.value.is_finite() && row.value >= 0.0, "{row:?}");
        assert_eq!(row.hardware, "trimoe-h100");
    }
}
