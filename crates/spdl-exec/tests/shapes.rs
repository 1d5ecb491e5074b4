//! Filter, split, aggregate (with and without drop_last), disaggregate, stream sources,
//! and continuous sources with epochs.

mod common;

use std::convert::Infallible;

use common::{take_items, watchdog};
use spdl_exec::{BuildOptions, Item, OutputOrder, PipelineBuilder, Stage};

fn collect<T: Send + 'static>(p: &spdl_exec::Pipeline<T>) -> Vec<T> {
    p.iter().map(|r| r.expect("item")).collect()
}

#[test]
fn filter_and_split_blocking_and_async() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source(0..50u32)
            .pipe(Stage::filter_map("evens", |x: u32| Ok::<_, Infallible>(x.is_multiple_of(2).then_some(x))))
            .pipe(Stage::flat_map("repeat", |x: u32| Ok::<_, Infallible>(std::iter::repeat_n(x, (x % 3) as usize))))
            .pipe(
                Stage::filter_map_async("not10", |x: u32| async move { Ok::<_, Infallible>((x != 10).then_some(x)) })
                    .order(OutputOrder::Input),
            )
            .pipe(Stage::flat_map_async("pair", |x: u32| async move { Ok::<_, Infallible>(vec![x, x + 1000]) }))
            .sink(3)
            .build(BuildOptions::default())
            .expect("build");
        let got = collect(&pipeline);
        let want: Vec<u32> = (0..50u32)
            .filter(|x| x.is_multiple_of(2))
            .flat_map(|x| std::iter::repeat_n(x, (x % 3) as usize))
            .filter(|&x| x != 10)
            .flat_map(|x| [x, x + 1000])
            .collect();
        assert_eq!(got, want);
        let stats = pipeline.stats();
        let repeat = stats.stage("repeat").expect("row");
        assert_eq!(repeat.items_in, 25);
        assert_eq!(repeat.items_out, (0..50u64).filter(|x| x.is_multiple_of(2)).map(|x| x % 3).sum::<u64>());
    });
}

#[test]
fn aggregate_keeps_or_drops_the_last_batch_and_disaggregate_flattens() {
    watchdog(120, || {
        let keep =
            PipelineBuilder::new().source(0..10u8).aggregate(4).sink(2).build(BuildOptions::default()).expect("build");
        assert_eq!(collect(&keep), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);

        let drop_last = PipelineBuilder::new()
            .source(0..10u8)
            .aggregate_drop_last(4)
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        assert_eq!(collect(&drop_last), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);

        let round_trip = PipelineBuilder::new()
            .source(0..1000u32)
            .aggregate(7)
            .pipe(Stage::map("sum-check", |v: Vec<u32>| if v.len() > 7 { Err("batch too big") } else { Ok(v) }))
            .disaggregate()
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        assert_eq!(collect(&round_trip), (0..1000).collect::<Vec<_>>());
    });
}

#[test]
fn stream_source() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .source_stream(futures::stream::iter(0..300u64))
            .pipe(Stage::map("inc", |x: u64| Ok::<_, Infallible>(x + 1)).concurrency(2))
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        let mut got = collect(&pipeline);
        got.sort_unstable();
        assert_eq!(got, (1..301).collect::<Vec<_>>());
    });
}

#[test]
fn continuous_source_iterates_epoch_by_epoch() {
    watchdog(120, || {
        // Concurrency 4 in completion order: the epoch barrier still keeps epochs apart.
        let pipeline = PipelineBuilder::new()
            .continuous_source(0..10u32)
            .pipe(Stage::map("b", |x: u32| Ok::<_, Infallible>(x)).concurrency(4))
            .pipe(Stage::map_async("a", |x: u32| async move { Ok::<_, Infallible>(x) }).concurrency(3))
            .aggregate(4)
            .sink(2)
            .build(BuildOptions::default())
            .expect("build");
        for epoch in 0..3 {
            let batches = collect(&pipeline);
            let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
            assert_eq!(sizes, vec![4, 4, 2], "epoch {epoch}");
            let mut items: Vec<u32> = batches.into_iter().flatten().collect();
            items.sort_unstable();
            assert_eq!(items, (0..10).collect::<Vec<_>>(), "epoch {epoch}");
        }
        pipeline.stop();
        assert!(pipeline.iter().next().is_none());
    });
}

#[test]
fn get_item_reports_epoch_markers() {
    watchdog(120, || {
        let pipeline = PipelineBuilder::new()
            .continuous_source(vec!["a", "b"])
            .sink(1)
            .build(BuildOptions::default())
            .expect("build");
        let seen = take_items(&pipeline, 6);
        assert_eq!(
            seen,
            vec![
                Item::Data("a"),
                Item::Data("b"),
                Item::EpochEnd { epoch: 0 },
                Item::Data("a"),
                Item::Data("b"),
                Item::EpochEnd { epoch: 1 },
            ]
        );
    });
}

/// The shape a language binding uses: a boxed, type-erased closure returning a `Vec`.
#[test]
fn boxed_type_erased_stage() {
    type Erased = Box<dyn Fn(u32) -> Result<Vec<u32>, spdl_exec::BoxError> + Send + Sync>;
    watchdog(60, || {
        let f: Erased = Box::new(|x| if x == 3 { Err("three".into()) } else { Ok(vec![x; 2]) });
        let pipeline = PipelineBuilder::new()
            .source(0..5u32)
            .pipe(Stage::flat_map("erased", f).order(OutputOrder::Input))
            .sink(1)
            .build(BuildOptions::default())
            .expect("build");
        assert_eq!(collect(&pipeline), vec![0, 0, 1, 1, 2, 2, 4, 4]);
    });
}

#[test]
fn invalid_options_are_build_errors() {
    let zero_conc = PipelineBuilder::new()
        .source(0..1u8)
        .pipe(Stage::map("z", |x: u8| Ok::<_, Infallible>(x)).concurrency(0))
        .sink(1)
        .build(BuildOptions::default());
    let err = zero_conc.expect_err("concurrency 0");
    assert!(err.to_string().contains("stage `z`: concurrency"), "{err}");

    let zero_batch = PipelineBuilder::new().source(0..1u8).aggregate(0).sink(1).build(BuildOptions::default());
    assert!(zero_batch.is_err());

    let zero_threads =
        PipelineBuilder::new().source(0..1u8).sink(1).build(BuildOptions { num_threads: 0, ..Default::default() });
    assert!(zero_threads.is_err());
}
