//! Samplers plug into spdl-exec as a source, `ObjectStore::get` as an async stage (spdl-exec is only a
//! dev-dependency: spdl-source stands alone).

use std::collections::BTreeSet;
use std::sync::Arc;

use spdl_exec::{BuildOptions, OutputOrder, PipelineBuilder, Stage};
use spdl_source::sampler::{Remainder, SamplerIter, ShardedSampler, ShuffledSampler};
use spdl_source::{Dataset, LocalStore, ObjectStore, Record, SourceError};

#[test]
fn sampler_source_and_store_stage() {
    let root = tempfile::tempdir().unwrap();
    for class in ["cat", "dog"] {
        std::fs::create_dir_all(root.path().join(class)).unwrap();
        for i in 0..50 {
            std::fs::write(root.path().join(class).join(format!("{i:02}.jpg")), format!("{class}/{i:02}")).unwrap();
        }
    }
    let dataset = Arc::new(Dataset::image_folder(root.path(), &["jpg"]).unwrap());
    let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::new(root.path()).unwrap());
    // Rank 1 of 2: half of the shuffled epoch.
    let sampler = ShardedSampler::new(ShuffledSampler::new(dataset.len(), 3), 1, 2, Remainder::Pad).unwrap();
    let mut order = SamplerIter::new(sampler);
    let expected: Vec<usize> = order.clone().epoch_iter().collect();
    let per_epoch = order.remaining_in_epoch();
    // Remove one of this rank's files after listing: its item fails in the stage, is counted, and the pipeline
    // goes on.
    let gone = dataset.records()[expected[5]].key.clone();
    std::fs::remove_file(root.path().join(&gone)).unwrap();

    let ds = dataset.clone();
    let pipeline = PipelineBuilder::new()
        .source(order.by_ref().take(per_epoch).collect::<Vec<usize>>())
        .pipe(Stage::map("lookup", move |i: usize| {
            ds.get(i).cloned().ok_or_else(|| format!("index {i} is past the dataset"))
        }))
        .pipe(
            Stage::map_async("get", move |record: Record| {
                let store = store.clone();
                async move {
                    let bytes = store.get(&record.key).await?;
                    Ok::<_, SourceError>((record, bytes))
                }
            })
            .concurrency(8)
            .order(OutputOrder::Input),
        )
        .sink(4)
        .build(BuildOptions::default())
        .unwrap();

    let mut got = Vec::new();
    for item in &pipeline {
        let (record, bytes) = item.unwrap();
        assert_eq!(&bytes[..], record.key.trim_end_matches(".jpg").as_bytes());
        got.push(record.key);
    }
    let wanted: Vec<String> =
        expected.iter().map(|&i| dataset.records()[i].key.clone()).filter(|k| *k != gone).collect();
    assert_eq!(got.len(), per_epoch - 1);
    assert_eq!(got, wanted, "input order kept, nothing lost or duplicated");
    let stats = pipeline.stats();
    assert_eq!(stats.stage("get").map(|s| s.items_failed), Some(1));
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), got.len());
    // The sampler stands at the next epoch: its state resumes there.
    assert_eq!(order.state().epoch, 1);
}
