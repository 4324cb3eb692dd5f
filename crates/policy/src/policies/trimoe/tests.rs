use super::*;
use crate::{Hardware, ModelShape};

fn job(gpu: f64, cpu: f64, ndp: Option<(u16, f64)>, read: (Option<u16>, f64)) -> JobCost {
    JobCost {
        gpu,
        gpu_reads: read.1 > 0.0,
        cpu,
        ndp,
        read,
    }
}

/// The smallest makespan over every assignment.
fn brute(costs: &[JobCost], units: u16) -> f64 {
    let opts: Vec<Vec<Device>> = costs.iter().map(|c| c.options().collect()).collect();
    let mut idx = vec![0usize; costs.len()];
    let mut best = f64::INFINITY;
    loop {
        let dev = idx.iter().zip(&opts).map(|(&i, o)| o[i]).collect();
        best = best.min(Schedule::new(costs.to_vec(), dev, units).makespan());
        let mut k = 0;
        while k < idx.len() {
            idx[k] += 1;
            if idx[k] < opts[k].len() {
                break;
            }
            idx[k] = 0;
            k += 1;
        }
        if k == idx.len() {
            return best;
        }
    }
}

fn solve(costs: &[JobCost], units: u16) -> (f64, f64) {
    let mut s = greedy(costs.to_vec(), units);
    let g = s.makespan();
    refine(&mut s, 100);
    (g, s.makespan())
}

#[test]
fn greedy_and_refinement_reach_the_optimum_on_hand_made_layers() {
    let none = (None, 0.0);
    let cases: Vec<(&str, Vec<JobCost>, u16)> = vec![
        (
            "warm experts fill the cpu, cold ones the dimms",
            vec![
                job(9.0, 2.0, None, (None, 0.5)),
                job(9.0, 2.0, None, (None, 0.5)),
                job(9.0, 6.0, Some((0, 3.0)), (Some(0), 2.0)),
                job(9.0, 6.0, Some((1, 3.0)), (Some(1), 2.0)),
                job(1.0, 4.0, None, none),
            ],
            2,
        ),
        (
            "a striped read on the cpu loads every dimm",
            vec![
                job(6.0, 3.0, None, (None, 2.0)),
                job(6.0, 3.0, None, (None, 2.0)),
                job(5.0, 8.0, Some((0, 2.0)), (Some(0), 4.0)),
                job(2.0, 8.0, Some((1, 1.0)), (Some(1), 4.0)),
            ],
            2,
        ),
        (
            "the list schedule is off by one expert; refinement moves it",
            vec![
                job(0.75, 5.02, None, (None, 0.01)),
                job(2.93, 1.57, None, (None, 0.09)),
                job(1.32, 0.78, Some((0, 3.87)), (Some(0), 0.58)),
                job(4.76, 0.56, None, (None, 0.10)),
                job(5.10, 4.29, None, (None, 0.22)),
                job(2.91, 1.54, Some((1, 1.90)), (Some(1), 0.03)),
            ],
            2,
        ),
        (
            "no cpu: gpu misses against one ndp unit",
            vec![
                job(3.0, f64::INFINITY, Some((0, 4.0)), (Some(0), 1.0)),
                job(3.0, f64::INFINITY, Some((0, 1.0)), (Some(0), 1.0)),
                job(1.0, f64::INFINITY, Some((0, 2.0)), (Some(0), 0.5)),
                job(2.0, f64::INFINITY, None, none),
            ],
            1,
        ),
    ];
    let mut fixed = 0;
    for (what, costs, units) in cases {
        let (g, r) = solve(&costs, units);
        let opt = brute(&costs, units);
        if g > opt + 1e-9 {
            fixed += 1;
        }
        assert!(r <= g + 1e-12, "{what}: refinement made it worse");
        assert!((r - opt).abs() < 1e-9, "{what}: {r} vs optimum {opt}");
    }
    assert_eq!(fixed, 1, "one case needs the refinement");
}

#[test]
fn refinement_never_hurts_and_often_finds_the_optimum() {
    // Seeded LCG: random 6-expert layers on 2 DIMMs.
    let mut x: u64 = 12345;
    let mut rnd = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) as f64) / (1u64 << 31) as f64
    };
    let (mut optimal, mut fixed, trials) = (0, 0, 300);
    for _ in 0..trials {
        let costs: Vec<JobCost> = (0..6)
            .map(|_| {
                let ndp = (rnd() < 0.5).then(|| ((rnd() * 2.0) as u16, 0.5 + 4.0 * rnd()));
                let read = match ndp {
                    Some((d, _)) => (Some(d), 2.0 * rnd()),
                    None => (None, 0.3 * rnd()),
                };
                job(0.5 + 5.0 * rnd(), 0.5 + 5.0 * rnd(), ndp, read)
            })
            .collect();
        let (g, r) = solve(&costs, 2);
        let opt = brute(&costs, 2);
        assert!(r <= g + 1e-12 && r >= opt - 1e-9);
        if (r - opt).abs() < 1e-9 {
            optimal += 1;
            if g > opt + 1e-9 {
                fixed += 1;
            }
        }
    }
    // 168 of 300 optimal, 37 of them thanks to the refinement, when written.
    assert!(fixed > 0);
    assert!(optimal * 2 >= trials, "{optimal}/{trials}");
}

fn cost() -> CostModel {
    let mut m = ModelShape::load("qwen3-30b-a3b").unwrap();
    m.n_experts = 8;
    m.n_layers = 1;
    CostModel::new(Hardware::load("trimoe-h100").unwrap(), m, 16.0, 16.0).unwrap()
}

fn policy(c: &CostModel, layout: Vec<Layout>, predicted: Vec<f64>) -> TriMoE {
    let mut p = TriMoE::new(TriMoEConfig::FULL, vec![predicted]);
    assert_eq!(layout.len(), c.model.n_experts);
    p.layout = vec![layout];
    p
}

#[test]
fn rebalancing_moves_cold_experts_from_the_busiest_dimm() {
    let c = cost();
    let nc = NdpCosts::new(&c);
    // Four cold experts all on DIMM 0, three tokens each; the rest idle.
    let mut layout = vec![Layout::Striped; 8];
    for x in layout.iter_mut().take(4) {
        *x = Layout::Localized(0);
    }
    let p = policy(&c, layout, vec![3.0, 3.0, 3.0, 3.0, 0.0, 0.0, 0.0, 0.0]);
    let none = vec![false; 8];
    let moves = p.plan(&nc, 0, &none, &none, 1.0, 0);
    assert!(!moves.is_empty());
    let mut targets = Vec::new();
    for (m, _) in &moves {
        match *m {
            Move::Relayout(e, Layout::Localized(d)) => {
                assert!(e < 4 && d != 0, "{m:?}");
                targets.push(d);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Each move goes to the idlest DIMM of its time: never twice to the same one
    // while others are empty, and DIMM 0 keeps at least one expert.
    let mut t = targets.clone();
    t.sort_unstable();
    t.dedup();
    assert_eq!(t.len(), targets.len(), "{targets:?}");
    assert!(moves.len() < 4);
    // No window, no moves.
    assert!(p.plan(&nc, 0, &none, &none, 0.0, 0).is_empty());
}

#[test]
fn the_window_grows_with_the_attention_context() {
    let c = cost();
    // Every expert localized on DIMM 0: striping or spreading them all would help, and
    // the overlap window decides how many moves run.
    let moves = |context: Option<usize>| {
        let mut p = policy(&c, vec![Layout::Localized(0); 8], vec![64.0; 8]);
        let tokens = 64;
        let ids: Vec<u32> = (0..tokens).flat_map(|_| 0..8u32).collect();
        let weights = vec![0.125f32; ids.len()];
        let resident = vec![false; 8];
        let view = LayerView {
            layer: 0,
            n_moe_layers: 1,
            phase: Phase::Decode,
            step: 1,
            top_k: 8,
            ids: &ids,
            weights: &weights,
            hidden: None,
            candidates: None,
            gpu: crate::GpuView {
                resident: &resident,
                free_bytes: 0,
                busy_s: 0.0,
            },
            cpu_busy_s: 0.0,
            pcie_busy_s: 0.0,
            context,
        };
        let d = p.decide(&view, &c);
        assert!(d.predicted_load.is_some());
        d.migrations.len()
    };
    let (none, long) = (moves(None), moves(Some(1 << 20)));
    assert!(
        long > none,
        "{none} moves at no context, {long} at 1M tokens"
    );
}

#[test]
fn relayouts_run_in_order_of_benefit_within_the_window() {
    let c = cost();
    let nc = NdpCosts::new(&c);
    // Experts 0 and 1 are warm but localized, so the host reads them at one DIMM's
    // share (eq. 2-3): striping them is the largest gain. Expert 2 (cold, striped) could
    // go to an NDP unit; experts 3 and 4 crowd DIMM 3.
    let mut layout = vec![Layout::Striped; 8];
    layout[0] = Layout::Localized(1);
    layout[1] = Layout::Localized(2);
    layout[3] = Layout::Localized(3);
    layout[4] = Layout::Localized(3);
    let pred = vec![60.0, 20.0, 1.0, 2.0, 2.0, 0.0, 0.0, 0.0];
    let p = policy(&c, layout, pred);
    let none = vec![false; 8];
    let all = p.plan(&nc, 0, &none, &none, 10.0, 0);
    assert!(all.len() >= 2, "{all:?}");
    assert!(
        matches!(all[0].0, Move::Relayout(0 | 1, Layout::Striped)),
        "{all:?}"
    );
    // Ranked by benefit: makespan reduction first, then summed device time.
    for w in all.windows(2) {
        let (a, b) = (w[0].1, w[1].1);
        assert!(a.0 > b.0 || (a.0 == b.0 && a.1 >= b.1), "{all:?}");
    }
    // A window of one move takes the most beneficial one.
    let one = p.plan(&nc, 0, &none, &none, nc.link_move() * 1.5, 0);
    assert_eq!(one.len(), 1, "{one:?}");
    assert_eq!(one[0].0, all[0].0);
}
