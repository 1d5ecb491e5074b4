//! The graph: merges (policies, stop rules, epochs), routes (completion and input order,
//! batched), regions, sub-pipelines as sources and through-stages, with the chain's
//! promises (every item delivered or counted, budgets, stats, threads joined).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use common::graph::{big_graph, branches, delay};
use common::watchdog;
use spdl_exec::{
    Branch, BuildOptions, FailureBudget, Inputs, Item, MergeOptions, MergePolicy, MergeStop, OutputOrder, Pipeline,
    PipelineBuilder, PipelineError, Stage, state,
};

fn opts() -> BuildOptions {
    BuildOptions { num_threads: 4, ..BuildOptions::default() }
}

fn collect<T: Send + 'static>(p: &Pipeline<T>) -> Vec<T> {
    p.iter().map(|r| r.expect("item")).collect()
}

fn input(range: std::ops::Range<u64>) -> PipelineBuilder<u64, state::Open> {
    PipelineBuilder::new().source(range)
}

fn merged(inputs: Vec<PipelineBuilder<u64, state::Open>>, options: MergeOptions) -> Vec<u64> {
    let p = PipelineBuilder::new().merge(inputs, options).sink(8).build(opts()).expect("build");
    collect(&p)
}

#[test]
fn round_robin_takes_one_from_each_input_in_turn_under_every_stop_rule() {
    watchdog(60, || {
        let three = || vec![input(0..3), input(10..12), input(20..23)];
        let rr = MergeOptions::new("m").policy(MergePolicy::RoundRobin);
        // Until all are exhausted: the short input drops out, the others go on.
        assert_eq!(merged(three(), rr.clone()), [0, 10, 20, 1, 11, 21, 2, 22]);
        // Stop at the first exhaustion.
        assert_eq!(merged(three(), rr.clone().stop(MergeStop::FirstExhausted)), [0, 10, 20, 1, 11, 21, 2]);
        // Stop after n items.
        assert_eq!(merged(three(), rr.stop(MergeStop::AfterItems(5))), [0, 10, 20, 1, 11]);
    });
}

#[test]
fn weighted_merge_follows_the_weights_within_two_percent_and_is_reproducible() {
    watchdog(120, || {
        let weights = vec![1.0, 2.0, 5.0];
        let run = |seed: u64| {
            let inputs = vec![input(0..1_000_000), input(1_000_000..2_000_000), input(2_000_000..3_000_000)];
            let options = MergeOptions::new("w")
                .policy(MergePolicy::Weighted { weights: weights.clone(), seed })
                .stop(MergeStop::AfterItems(100_000));
            merged(inputs, options)
        };
        let a = run(7);
        assert_eq!(a.len(), 100_000);
        let total: f64 = weights.iter().sum();
        for (k, w) in weights.iter().enumerate() {
            let n = a.iter().filter(|&&x| x / 1_000_000 == k as u64).count() as f64;
            let share = n / a.len() as f64;
            assert!((share - w / total).abs() < 0.02, "input {k}: share {share}, weight {}", w / total);
        }
        // Items of one input keep their order.
        let firsts: Vec<u64> = a.iter().copied().filter(|x| *x < 1_000_000).collect();
        assert!(firsts.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(run(7), a, "same seed, same order");
        assert_ne!(run(8), a, "another seed, another order");
    });
}

#[test]
fn weighted_merge_drops_exhausted_inputs_and_zero_weights() {
    watchdog(60, || {
        // All exhausted: every item of the non-zero inputs comes out; the zero-weight one never.
        let inputs = vec![input(0..50), input(100..400), input(1000..1010)];
        let options = MergeOptions::new("w").policy(MergePolicy::Weighted { weights: vec![1.0, 1.0, 0.0], seed: 3 });
        let mut out = merged(inputs, options);
        out.sort_unstable();
        let want: Vec<u64> = (0..50).chain(100..400).collect();
        assert_eq!(out, want);
        // First exhausted: ends when the short input runs out.
        let inputs = vec![input(0..50), input(100..10_000)];
        let options = MergeOptions::new("w")
            .policy(MergePolicy::Weighted { weights: vec![1.0, 1.0], seed: 3 })
            .stop(MergeStop::FirstExhausted);
        let out = merged(inputs, options);
        assert_eq!(out.iter().filter(|&&x| x < 50).count(), 50);
        assert!(out.len() < 200, "{}", out.len());
    });
}

#[test]
fn invalid_merges_are_build_errors() {
    let bad = |options: MergeOptions, n: usize| {
        let inputs = (0..n).map(|_| input(0..1)).collect();
        PipelineBuilder::new().merge(inputs, options).sink(1).build(opts()).err()
    };
    let weighted = |w: Vec<f64>| MergeOptions::new("m").policy(MergePolicy::Weighted { weights: w, seed: 0 });
    assert!(matches!(bad(MergeOptions::new("m"), 0), Some(PipelineError::InvalidOption { .. })));
    assert!(bad(weighted(vec![1.0]), 2).is_some());
    assert!(bad(weighted(vec![1.0, f64::NAN]), 2).is_some());
    assert!(bad(weighted(vec![1.0, -1.0]), 2).is_some());
    assert!(bad(weighted(vec![0.0, 0.0]), 2).is_some());
}

#[test]
fn as_available_merges_inputs_of_different_speeds_losing_nothing_with_their_own_stats_rows() {
    watchdog(60, || {
        let slow = input(0..50).pipe(Stage::map("slow", |x: u64| {
            std::thread::sleep(Duration::from_millis(2));
            Ok::<_, std::io::Error>(x)
        }));
        let fast = input(1000..1500).pipe(Stage::map("fast", |x: u64| Ok::<_, std::io::Error>(x)).concurrency(2));
        let p = PipelineBuilder::new().merge(vec![slow, fast], MergeOptions::new("mix")).sink(4).build(opts()).unwrap();
        let mut out = collect(&p);
        out.sort_unstable();
        assert_eq!(out, (0..50).chain(1000..1500).collect::<Vec<_>>());
        // The fast input is not held back by the slow one: most of it came before the slow one ended.
        let stats = p.stats();
        assert_eq!(stats.stage("mix[0]/slow").map(|s| s.items_out), Some(50));
        assert_eq!(stats.stage("mix[1]/fast").map(|s| s.items_out), Some(500));
        assert_eq!(stats.stage("mix").map(|s| s.items_out), Some(550));
        let table = stats.to_string();
        assert!(table.contains("mix[0]/source") && table.contains("mix[1]/source"), "{table}");
    });
}

#[test]
fn epochs_end_downstream_once_every_merge_input_has_ended_them() {
    watchdog(60, || {
        let a = PipelineBuilder::new().continuous_source(vec![1u64, 2, 3]);
        let b = PipelineBuilder::new().continuous_source(vec![10u64, 20, 30, 40, 50, 60, 70]);
        for policy in [MergePolicy::AsAvailable, MergePolicy::RoundRobin] {
            let inputs = vec![a_clone(&[1, 2, 3]), a_clone(&[10, 20, 30, 40, 50, 60, 70])];
            let p = PipelineBuilder::new()
                .merge(inputs, MergeOptions::new("m").policy(policy.clone()))
                .sink(4)
                .build(opts())
                .unwrap();
            for _epoch in 0..5 {
                let mut got = collect(&p);
                got.sort_unstable();
                assert_eq!(got, [1, 2, 3, 10, 20, 30, 40, 50, 60, 70], "{policy:?}");
            }
        }
        drop((a, b));
    });
}

fn a_clone(v: &[u64]) -> PipelineBuilder<u64, state::Open> {
    PipelineBuilder::new().continuous_source(v.to_vec())
}

/// What the route above makes of `0..n`, in input order.
fn expected(n: u64) -> Vec<u64> {
    let mut want = Vec::new();
    for x in 0..n {
        if x % 2 == 0 {
            want.push(x * 2);
        } else if x % 9 != 0 && x % 5 != 0 {
            want.extend([x * 10, x * 10 + 1]);
        }
    }
    want
}

#[test]
fn a_route_in_input_order_keeps_order_through_failures_filters_and_fan_out() {
    watchdog(60, || {
        let p = PipelineBuilder::new()
            .source(0..2000u64)
            .route("parity", |x: &u64| Ok::<_, std::io::Error>((x % 2) as usize), branches(), OutputOrder::Input)
            .sink(4)
            .build(opts())
            .unwrap();
        assert_eq!(collect(&p), expected(2000));
        let stats = p.stats();
        let failed = stats.stage("parity[1]/odd_or_fail").map(|s| s.items_failed);
        assert_eq!(failed, Some((0..2000u64).filter(|x| x % 2 == 1 && x % 9 == 0).count() as u64));
        assert!(stats.stage("parity/join").is_some(), "{stats}");
    });
}

#[test]
fn a_route_in_completion_order_loses_and_duplicates_nothing() {
    watchdog(60, || {
        let p = PipelineBuilder::new()
            .source(0..2000u64)
            .route("parity", |x: &u64| Ok::<_, std::io::Error>((x % 2) as usize), branches(), OutputOrder::Completion)
            .sink(4)
            .build(opts())
            .unwrap();
        let mut got = collect(&p);
        got.sort_unstable();
        let mut want = expected(2000);
        want.sort_unstable();
        assert_eq!(got, want);
    });
}

#[test]
fn classifier_failures_and_missing_branches_fail_the_routing_stage() {
    watchdog(60, || {
        for order in [OutputOrder::Completion, OutputOrder::Input] {
            let p = PipelineBuilder::new()
                .source(0..300u64)
                .route(
                    "pick",
                    |x: &u64| match x % 3 {
                        0 => Err(format!("cannot classify {x}")),
                        1 => Ok(0),
                        _ => Ok(7), // no such branch
                    },
                    vec![Branch::new(), Branch::new()],
                    order,
                )
                .sink(4)
                .build(opts())
                .unwrap();
            let got = collect(&p);
            assert_eq!(got, (0..300).filter(|x| x % 3 == 1).collect::<Vec<_>>(), "{order:?}");
            assert_eq!(p.stats().stage("pick").map(|s| s.items_failed), Some(200), "{order:?}");
        }
    });
}

#[test]
fn a_branch_stage_budget_ends_the_run_naming_the_branch_stage() {
    watchdog(60, || {
        let failing = Branch::new().pipe(
            Stage::map("fragile", |x: u64| if x % 4 == 1 { Err(format!("bad {x}")) } else { Ok(x) })
                .failure_budget(FailureBudget::Count(3)),
        );
        let p = PipelineBuilder::new()
            .source(0..10_000u64)
            .route(
                "r",
                |x: &u64| Ok::<_, std::io::Error>((x % 2) as usize),
                vec![Branch::new(), failing],
                OutputOrder::Completion,
            )
            .sink(4)
            .build(opts())
            .unwrap();
        let err = p.iter().find_map(Result::err).expect("the budget ends the run");
        assert_eq!(err.stage(), Some("r[1]/fragile"), "{err}");
    });
}

#[test]
fn batched_routes_split_batches_by_element_and_rejoin_them_in_order() {
    watchdog(60, || {
        let small = Branch::new().pipe(Stage::map("inc", |v: Vec<u64>| {
            delay(v.len() as u64);
            Ok::<_, std::io::Error>(v.into_iter().map(|x| x + 1).collect::<Vec<_>>())
        }));
        let big = Branch::new().pipe(
            Stage::map("keep_even_or_fail", |v: Vec<u64>| {
                if v.contains(&77) {
                    return Err("77 in the batch".to_owned());
                }
                Ok(v.into_iter().filter(|x| x % 2 == 0).collect::<Vec<_>>())
            })
            .concurrency(3),
        );
        let p = PipelineBuilder::new()
            .source(0..200u64)
            .aggregate(10)
            .route_batched(
                "split",
                |b: &[u64]| Ok::<_, std::io::Error>(b.iter().map(|&x| usize::from(x % 10 >= 5)).collect()),
                vec![small, big],
            )
            .sink(2)
            .build(opts())
            .unwrap();
        let got = collect(&p);
        let mut want = Vec::new();
        for chunk in (0..200u64).collect::<Vec<_>>().chunks(10) {
            let mut b: Vec<u64> = chunk.iter().filter(|x| *x % 10 < 5).map(|x| x + 1).collect();
            let big: Vec<u64> = chunk.iter().copied().filter(|x| x % 10 >= 5).collect();
            if !big.contains(&77) {
                b.extend(big.into_iter().filter(|x| x % 2 == 0));
            }
            want.push(b);
        }
        assert_eq!(got, want);
        assert_eq!(p.stats().stage("split[1]/keep_even_or_fail").map(|s| s.items_failed), Some(1));
    });
}

#[test]
fn an_aggregate_in_an_input_ordered_route_is_a_build_error() {
    let branch = Branch::new()
        .aggregate(4)
        .pipe(Stage::map("sum", |v: Vec<u64>| Ok::<_, std::io::Error>(v.iter().sum::<u64>())));
    let err = PipelineBuilder::new()
        .source(0..10u64)
        .route("r", |_: &u64| Ok::<_, std::io::Error>(0), vec![branch], OutputOrder::Input)
        .sink(1)
        .build(opts())
        .unwrap_err();
    assert!(err.to_string().contains("aggregate(4)"), "{err}");
    // In completion order it is fine.
    let branch = Branch::new()
        .aggregate(4)
        .pipe(Stage::map("sum", |v: Vec<u64>| Ok::<_, std::io::Error>(v.iter().sum::<u64>())));
    let p = PipelineBuilder::new()
        .source(0..10u64)
        .route("r", |_: &u64| Ok::<_, std::io::Error>(0), vec![branch], OutputOrder::Completion)
        .sink(1)
        .build(opts())
        .unwrap();
    assert_eq!(collect(&p), [6, 22, 17]);
}

#[test]
fn epochs_pass_through_routes_in_both_orders() {
    watchdog(60, || {
        for order in [OutputOrder::Completion, OutputOrder::Input] {
            let p = PipelineBuilder::new()
                .continuous_source((0..100u64).collect::<Vec<_>>())
                .route("parity", |x: &u64| Ok::<_, std::io::Error>((x % 2) as usize), branches(), order)
                .sink(4)
                .build(opts())
                .unwrap();
            for _ in 0..3 {
                let mut got = collect(&p);
                let mut want = expected(100);
                if order == OutputOrder::Completion {
                    got.sort_unstable();
                    want.sort_unstable();
                }
                assert_eq!(got, want, "{order:?}");
            }
        }
    });
}

#[test]
fn a_region_runs_its_stages_on_its_own_threads() {
    watchdog(60, || {
        let outside = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let inside = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let (o, i) = (Arc::clone(&outside), Arc::clone(&inside));
        let body = Branch::new().pipe(
            Stage::map("heavy", move |x: u64| {
                i.lock().unwrap().insert(format!("{:?}", std::thread::current().id()));
                std::thread::sleep(Duration::from_micros(200));
                Ok::<_, std::io::Error>(x + 1)
            })
            .concurrency(2),
        );
        let p = PipelineBuilder::new()
            .source(0..300u64)
            .pipe(Stage::map("light", move |x: u64| {
                o.lock().unwrap().insert(format!("{:?}", std::thread::current().id()));
                Ok::<_, std::io::Error>(x)
            }))
            .region("decoding", 2, body)
            .sink(4)
            .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
            .unwrap();
        assert_eq!(collect(&p).iter().sum::<u64>(), (1..=300).sum::<u64>());
        let (outside, inside) = (outside.lock().unwrap(), inside.lock().unwrap());
        assert!(outside.is_disjoint(&inside), "region stages ran on the pipeline's pool");
        assert!(inside.len() <= 2);
        assert!(p.stats().stage("decoding/heavy").is_some());
    });
}

#[test]
fn a_pipeline_is_a_source_of_another_with_its_epochs_and_its_failure() {
    watchdog(60, || {
        let upstream = PipelineBuilder::new().continuous_source(vec![1u64, 2, 3]).sink(2).build(opts()).unwrap();
        let p = PipelineBuilder::new()
            .source_pipeline(upstream)
            .pipe(Stage::map("x10", |x: u64| Ok::<_, std::io::Error>(x * 10)))
            .sink(2)
            .build(opts())
            .unwrap();
        for _ in 0..3 {
            assert_eq!(collect(&p), [10, 20, 30]);
        }
        drop(p);
        let failing = PipelineBuilder::new()
            .source(0..100u64)
            .pipe(
                Stage::map("bad", |x: u64| if x >= 5 { Err("no") } else { Ok(x) })
                    .failure_budget(FailureBudget::Count(0)),
            )
            .sink(1)
            .build(opts())
            .unwrap();
        let p = PipelineBuilder::new().source_pipeline(failing).sink(1).build(opts()).unwrap();
        let results: Vec<_> = p.iter().collect();
        let err = results.last().and_then(|r| r.as_ref().err()).expect("upstream failure");
        let text = spdl_report::error_chain(err);
        assert!(matches!(err, PipelineError::Upstream(_)), "{text}");
        // The outer error names its own layer; the upstream failure is its cause, shown once.
        assert_eq!(err.to_string(), "the upstream pipeline failed");
        assert!(text.starts_with("the upstream pipeline failed: "), "{text}");
        assert_eq!(text.matches("`bad`").count(), 1, "{text}");
    });
}

#[test]
fn a_through_stage_sees_each_epoch_as_a_stream_and_its_failures_count() {
    watchdog(60, || {
        let p = PipelineBuilder::new()
            .continuous_source(vec![1u64, 2, 3, 4])
            .through("sums", |inputs: Inputs<u64>| {
                Ok::<_, std::io::Error>(inputs.scan(0, |acc, x| {
                    *acc += x;
                    Some(Ok::<_, std::io::Error>(*acc))
                }))
            })
            .sink(2)
            .build(opts())
            .unwrap();
        for _ in 0..3 {
            assert_eq!(collect(&p), [1, 3, 6, 10]);
        }
        drop(p);
        // The output iterator fails after two outputs: one failure, and the inputs it left are failures.
        let p = PipelineBuilder::new()
            .source(0..10u64)
            .through("brittle", |inputs: Inputs<u64>| {
                Ok::<_, std::io::Error>(inputs.map(|x| if x == 2 { Err("boom") } else { Ok(x) }))
            })
            .sink(2)
            .build(opts())
            .unwrap();
        assert_eq!(collect(&p), [0, 1]);
        let s = p.stats();
        let row = s.stage("brittle").unwrap();
        assert_eq!(row.items_out, 2);
        assert_eq!(row.items_failed, 1 + 7);
    });
}

#[test]
fn stats_name_every_node_of_the_graph() {
    let p = big_graph(Arc::new(AtomicU64::new(0)));
    let got: Vec<_> = p.iter().take(100).map(Result::unwrap).collect();
    assert_eq!(got.len(), 100);
    let names: Vec<String> = p.stats().stages.iter().map(|s| s.name.clone()).collect();
    for want in [
        "m[0]/source",
        "m[0]/a",
        "m[1]/b",
        "m",
        "route",
        "route[0]/double",
        "route[1]/twice",
        "route/join",
        "region/r",
        "t",
        "sink",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    let counts: HashMap<&str, usize> = names.iter().fold(HashMap::new(), |mut m, n| {
        *m.entry(n.as_str()).or_default() += 1;
        m
    });
    assert!(counts.values().all(|&c| c == 1), "{counts:?}");
    let _ = Item::<u64>::EpochEnd { epoch: 0 };
}
