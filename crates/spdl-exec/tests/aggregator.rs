//! Custom aggregation (`PipelineBuilder::aggregate_with`): order, flush at epoch ends and at
//! the end of the input, `drop_last`, failures and panics counted, and the budget.

mod common;

use common::{take_items, watchdog};
use spdl_exec::{Aggregator, BoxError, BuildOptions, FailureBudget, Item, PipelineBuilder, PipelineError, Stage};

/// Sums numbers until the sum reaches `limit`; fails on 13 and panics on 666.
struct SumTo {
    limit: u64,
    sum: u64,
    flushes: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl SumTo {
    fn new(limit: u64) -> Self {
        Self { limit, sum: 0, flushes: Default::default() }
    }
}

impl Aggregator<u64> for SumTo {
    type Output = u64;

    fn accumulate(&mut self, x: u64) -> Result<Option<u64>, BoxError> {
        match x {
            13 => return Err("unlucky".into()),
            666 => panic!("the number of the beast"),
            _ => {}
        }
        self.sum += x;
        Ok((self.sum >= self.limit).then(|| std::mem::take(&mut self.sum)))
    }

    fn flush(&mut self) -> Result<Option<u64>, BoxError> {
        self.flushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok((self.sum > 0).then(|| std::mem::take(&mut self.sum)))
    }
}

/// What `SumTo` emits for `xs` (without failures), with or without the last partial sum.
fn expected(xs: impl IntoIterator<Item = u64>, limit: u64, drop_last: bool) -> Vec<u64> {
    let (mut out, mut sum) = (Vec::new(), 0);
    for x in xs {
        sum += x;
        if sum >= limit {
            out.push(std::mem::take(&mut sum));
        }
    }
    if sum > 0 && !drop_last {
        out.push(sum);
    }
    out
}

#[test]
fn items_arrive_in_order_and_the_rest_is_flushed_at_the_end() {
    watchdog(120, || {
        for drop_last in [false, true] {
            let agg = SumTo::new(50);
            let flushes = std::sync::Arc::clone(&agg.flushes);
            let pipeline = PipelineBuilder::new()
                .source(0..100u64)
                .pipe(Stage::filter_map("skip-bad", |x: u64| Ok::<_, BoxError>((x != 13).then_some(x))))
                .aggregate_with("sum-to-50", agg, drop_last)
                .pipe(Stage::map("id", Ok::<u64, BoxError>))
                .sink(2)
                .build(BuildOptions::default())
                .expect("build");
            let got: Vec<u64> = pipeline.iter().map(|r| r.expect("item")).collect();
            assert_eq!(got, expected((0..100).filter(|&x| x != 13), 50, drop_last), "drop_last={drop_last}");
            assert_eq!(flushes.load(std::sync::atomic::Ordering::Relaxed), u64::from(!drop_last));
            let stats = pipeline.stats();
            let row = stats.stage("sum-to-50").expect("row");
            assert_eq!((row.items_in, row.items_out, row.items_failed), (99, got.len() as u64, 0));
        }
    });
}

#[test]
fn each_epoch_is_flushed_and_its_marker_kept() {
    watchdog(120, || {
        for drop_last in [false, true] {
            let pipeline = PipelineBuilder::new()
                .continuous_source(vec![10u64, 20, 30, 40])
                .aggregate_with("sum-to-25", SumTo::new(25), drop_last)
                .sink(1)
                .build(BuildOptions::default())
                .expect("build");
            let seen = take_items(&pipeline, 6);
            pipeline.stop();
            // 10+20 = 30, 30 = 30, 40 = 40: nothing left in either mode at the epoch end.
            let want = vec![
                Item::Data(30),
                Item::Data(30),
                Item::Data(40),
                Item::EpochEnd { epoch: 0 },
                Item::Data(30),
                Item::Data(30),
            ];
            assert_eq!(seen, want, "drop_last={drop_last}");
        }
        for (drop_last, want) in [
            (false, vec![Item::Data(30), Item::Data(5), Item::EpochEnd { epoch: 0 }, Item::Data(30), Item::Data(5)]),
            // drop_last: the partial 5 of each epoch is flushed away, not carried into the next.
            (
                true,
                vec![
                    Item::Data(30),
                    Item::EpochEnd { epoch: 0 },
                    Item::Data(30),
                    Item::EpochEnd { epoch: 1 },
                    Item::Data(30),
                ],
            ),
        ] {
            let pipeline = PipelineBuilder::new()
                .continuous_source(vec![10u64, 20, 5])
                .aggregate_with("sum-to-25", SumTo::new(25), drop_last)
                .sink(1)
                .build(BuildOptions::default())
                .expect("build");
            let seen = take_items(&pipeline, want.len());
            pipeline.stop();
            assert_eq!(seen, want, "drop_last={drop_last}");
        }
    });
}

#[test]
fn errors_and_panics_fail_their_call_and_the_budget_ends_the_run() {
    watchdog(120, || {
        // Unlimited: the failed calls are counted and the run goes on.
        let pipeline = PipelineBuilder::new()
            .source([1u64, 13, 2, 666, 3, 13, 4])
            .aggregate_with("sum", SumTo::new(1000), false)
            .sink(1)
            .build(BuildOptions::default())
            .expect("build");
        let got: Vec<u64> = pipeline.iter().map(|r| r.expect("item")).collect();
        assert_eq!(got, vec![10]);
        let stats = pipeline.stats();
        assert_eq!(stats.stage("sum").map(|s| s.items_failed), Some(3));

        // A pipeline budget of 1: the second failure ends the run with an error naming the stage.
        let pipeline = PipelineBuilder::new()
            .source((0..10_000u64).map(|x| if x % 100 == 13 { 13 } else { 1 }))
            .aggregate_with("sum", SumTo::new(10), false)
            .sink(1)
            .build(BuildOptions { failure_budget: FailureBudget::Count(1), ..BuildOptions::default() })
            .expect("build");
        let mut n = 0;
        let mut error = None;
        for r in &pipeline {
            match r {
                Ok(_) => n += 1,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        assert!(n < 1000, "the run went on after the budget was spent: {n} sums");
        match error {
            Some(PipelineError::PipelineBudgetExceeded { stage, failed, causes, .. }) => {
                assert_eq!(stage, "sum");
                assert_eq!(failed, 2);
                assert!(causes.iter().any(|c| c.cause.contains("unlucky")), "{causes:?}");
            }
            other => panic!("expected PipelineBudgetExceeded, got {other:?}"),
        }
    });
}
