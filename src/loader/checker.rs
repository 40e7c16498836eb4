//! Who checks an epoch's samples: decided once, when the epoch is asked for, and carried with
//! it — by the I/O thread (which checks groups ahead of the consumer), the consumer (which
//! checks what the I/O thread had not reached), the decode threads and the device image stage.
//!
//! Frames (TFRecord's length and crc, the packed format's framing) are always the loader's:
//! the I/O thread and the consumer parse them to find each payload. Checksums of an unframed
//! format's samples go to whoever takes the batches where that is an image stage — on the
//! device its crc32c kernel, on the host each decode thread just before it decodes the sample,
//! while the bytes are in its cache — so the loader does not read the bytes for them; else
//! they are the loader's too.

use crate::dataset::{Dataset, Frame};

/// Who takes an epoch's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(feature = "decode"),
    allow(
        dead_code,
        reason = "the image stage's takers are used only with feature decode"
    )
)]
pub(crate) enum Taker {
    /// The caller, as raw batches.
    Consumer,
    /// The image stage, decoding on the host.
    DecodeThreads,
    /// The image stage on the device.
    Device,
}

/// Who verifies the samples' checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checksums {
    /// Nobody: checks are off, or the format has none.
    Off,
    /// The loader: the I/O thread, and the consumer for the rest.
    Loader,
    /// The decode threads, each sample before it is decoded.
    DecodeThreads,
    /// The device image stage's crc32c kernel.
    Device,
}

/// Who checks an epoch's samples ([module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checker {
    /// The format frames its samples: the loader parses each frame.
    frames: bool,
    checksums: Checksums,
}

impl Checker {
    /// The checks of an epoch of `ds`, with checksums verified or not (`verify`), whose
    /// batches `taker` takes.
    pub(crate) fn of(ds: &Dataset, verify: bool, taker: Taker) -> Checker {
        let frames = ds.frame() != Frame::None;
        let checksums = match (verify && ds.has_checksums(), frames, taker) {
            (false, ..) => Checksums::Off,
            // A frame is parsed by the loader: its checksum is checked there too.
            (true, true, _) | (true, false, Taker::Consumer) => Checksums::Loader,
            (true, false, Taker::DecodeThreads) => Checksums::DecodeThreads,
            (true, false, Taker::Device) => Checksums::Device,
        };
        Checker { frames, checksums }
    }

    /// The loader (the I/O thread ahead, the consumer for the rest) has something to check:
    /// frames to parse or checksums to verify.
    pub(crate) fn loader_checks(&self) -> bool {
        self.frames || self.checksums == Checksums::Loader
    }

    /// The loader verifies the checksums.
    pub(crate) fn loader_verifies(&self) -> bool {
        self.checksums == Checksums::Loader
    }

    /// The decode threads verify each sample's checksum before they decode it.
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the image stage checks what was left to it"
        )
    )]
    pub(crate) fn decode_threads_verify(&self) -> bool {
        self.checksums == Checksums::DecodeThreads
    }

    /// The device image stage verifies the checksums (its crc32c kernel).
    #[cfg_attr(
        not(feature = "decode"),
        allow(
            dead_code,
            reason = "used only with feature decode: the image stage checks what was left to it"
        )
    )]
    pub(crate) fn device_verifies(&self) -> bool {
        self.checksums == Checksums::Device
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case of who checks: frames always the loader's, with their checksums; an unframed
    /// format's checksums the taker's where an image stage takes the batches; nobody's where
    /// checks are off or the format has none.
    #[test]
    fn who_checks_follows_the_format_and_the_taker() {
        let ds = |checksums: bool, frame: Frame| {
            let mut ds = Dataset::from_parts(Vec::new(), Vec::new(), Vec::new()).unwrap();
            ds.has_checksums = checksums;
            ds.frame = frame;
            ds
        };
        // (checksums, framed, verify, taker) → (loader checks, loader verifies, decode
        // threads verify, device verifies)
        let cases = [
            (
                true,
                false,
                true,
                Taker::Consumer,
                (true, true, false, false),
            ),
            (
                true,
                false,
                true,
                Taker::DecodeThreads,
                (false, false, true, false),
            ),
            (
                true,
                false,
                true,
                Taker::Device,
                (false, false, false, true),
            ),
            (true, true, true, Taker::Device, (true, true, false, false)),
            (
                true,
                true,
                true,
                Taker::DecodeThreads,
                (true, true, false, false),
            ),
            (
                true,
                true,
                false,
                Taker::Consumer,
                (true, false, false, false),
            ),
            (
                true,
                false,
                false,
                Taker::Device,
                (false, false, false, false),
            ),
            (
                false,
                false,
                true,
                Taker::Consumer,
                (false, false, false, false),
            ),
            (
                false,
                false,
                true,
                Taker::DecodeThreads,
                (false, false, false, false),
            ),
        ];
        for (checksums, framed, verify, taker, want) in cases {
            let frame = if framed { Frame::TfRecord } else { Frame::None };
            let c = Checker::of(&ds(checksums, frame), verify, taker);
            let got = (
                c.loader_checks(),
                c.loader_verifies(),
                c.decode_threads_verify(),
                c.device_verifies(),
            );
            assert_eq!(got, want, "{checksums} {framed} {verify} {taker:?}");
        }
    }
}
