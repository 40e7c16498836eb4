//! The `tf.train.Example` parser (protobuf wire format, by hand): finding the payload
//! `bytes_list` and the label `int64_list` in a record's data.
//!
//! The first input byte picks the feature names: bit 0 short names (`p`, `l`) that mutations
//! find quickly, else TensorFlow's ImageNet names; bit 1 no label feature. The rest is the data.
#![no_main]
use gpufeed::testing::example::{find, ExampleSpec};
use gpufeed_fuzz::{Budget, Counting};

#[global_allocator]
static A: Counting = Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (payload, label) = if mode & 1 != 0 {
        ("p", "l")
    } else {
        ("image/encoded", "image/class/label")
    };
    let spec = ExampleSpec {
        payload: payload.into(),
        label: (mode & 2 == 0).then(|| label.into()),
        label_offset: 1,
    };
    let budget = Budget::start("example", rest.len(), 0, 0);
    match find(rest, &spec) {
        Ok(found) => {
            // The documented promise: a record that has its payload costs no allocation.
            budget.check();
            let r = found.payload;
            assert!(
                r.start <= r.end && r.end <= rest.len(),
                "payload {r:?} outside the record"
            );
            assert!(spec.label.is_some() || found.label.is_none());
        }
        Err(msg) => {
            assert!(!msg.is_empty());
            // The message names up to 16 features, each escaped (≤ 10 bytes per input byte).
            let grew = budget.grew();
            assert!(
                grew <= 160 * rest.len() + 4096,
                "an error cost {grew} bytes of heap"
            );
        }
    }
});
