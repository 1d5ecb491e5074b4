//! Partial results: a call over a group of parts books each failed part as a failed item of
//! its stage (stats, budgets), while the rest of the group goes on.

use spdl_exec::{BuildOptions, FailureBudget, ItemFailure, Partial, PipelineBuilder, Stage};

/// Keeps the multiples of 3 out of each batch, as failed parts.
fn sieve(batch: Vec<u64>) -> Result<Partial<Vec<u64>>, std::io::Error> {
    let parts = batch.len() as u64;
    let mut ok = Vec::new();
    let mut failures = Vec::new();
    for x in batch {
        if x % 3 == 0 {
            failures.push(ItemFailure::part(format!("#{x}"), format!("{x} is a multiple of 3")));
        } else {
            ok.push(x);
        }
    }
    Ok(Partial { output: ok, parts, failures })
}

#[test]
fn failed_parts_are_failed_items_of_the_stage() {
    let p = PipelineBuilder::new()
        .source(1..=300u64)
        .aggregate(32)
        .pipe(Stage::map_partial("sieve", sieve).concurrency(2))
        .sink(2)
        .build(BuildOptions::default())
        .unwrap();
    let kept: usize = p.iter().map(|b| b.unwrap().len()).sum();
    assert_eq!(kept, 200);
    let stats = p.stats();
    let row = stats.stage("sieve").unwrap();
    assert_eq!(row.items_failed, 100);
    assert_eq!(row.items_in, 10, "batches in");
}

#[test]
fn failed_parts_spend_the_stage_budget_and_name_the_part() {
    let p = PipelineBuilder::new()
        .source(1..=3000u64)
        .aggregate(30)
        .pipe(Stage::map_partial("sieve", sieve).failure_budget(FailureBudget::Count(25)))
        .sink(2)
        .build(BuildOptions::default())
        .unwrap();
    let err = p.iter().find_map(Result::err).expect("the budget ends the run");
    assert_eq!(err.stage(), Some("sieve"));
    let first = &err.causes()[0];
    assert_eq!(first.item.as_deref(), Some("#3"));
    assert!(first.cause.contains("multiple of 3"), "{first}");
    // A third of the parts fail: within a fraction budget of 0.4 (judged per part), above 0.3.
    for (fraction, ends) in [(0.4, false), (0.3, true)] {
        let p = PipelineBuilder::new()
            .source(1..=3000u64)
            .aggregate(30)
            .pipe(Stage::map_partial("sieve", sieve).failure_budget(FailureBudget::Fraction(fraction)))
            .sink(2)
            .build(BuildOptions::default())
            .unwrap();
        assert_eq!(p.iter().any(|r| r.is_err()), ends, "fraction {fraction}");
    }
}
