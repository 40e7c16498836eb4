//! gpufeed's kernels on the host, for the simulated device: the same `kernels/*.cu` sources
//! the GPU runs, compiled by build.rs for the CPU through `kernels/host_shim.h` (feature `sim`
//! with a C++ compiler at build time; other builds say so when a launch is asked). Each launch checks every bound the kernel relies on
//! first — the kernels themselves trust their parameters, as on the device.

use super::kernels::{check_resize, check_spans, GfEmit, GfSample, GfSpan};
use crate::error::{invalid, Result};
#[cfg(not(gf_host_kernels))]
use crate::error::{Error, ErrorKind};

#[cfg(gf_host_kernels)]
unsafe extern "C" {
    fn gf_host_resize(
        grid_x: u32,
        grid_y: u32,
        block_x: u32,
        src: *const u8,
        samples: *const GfSample,
        emit: *const GfEmit,
        out: *mut u8,
    );
    fn gf_host_crc32c(
        data: *const u8,
        spans: *const GfSpan,
        n: u32,
        lanes: *mut u32,
        out: *mut u32,
    );
}

/// Threads per block, as the CUDA launches use.
pub const BLOCK: u32 = super::kernels::BLOCK;

/// Whether this build carries the host kernels.
pub fn available() -> bool {
    cfg!(gf_host_kernels)
}

#[cfg(not(gf_host_kernels))]
fn unavailable() -> Error {
    Error::new(
        ErrorKind::Unsupported,
        "the simulated device's kernels are not in this build (feature `sim` with a C++ \
         compiler at build time: install g++ and rebuild)",
    )
}

/// Runs `gf_resize` over `samples` (images in `src`) into `out`, the batch tensor.
pub fn resize(src: &[u8], samples: &[GfSample], emit: &GfEmit, out: &mut [u8]) -> Result<()> {
    check_resize(src.len(), samples, emit, out.len())?;
    let pixels = emit.out_w as u64 * emit.out_h as u64;
    if samples.is_empty() || pixels == 0 {
        return Ok(());
    }
    let grid_x = u32::try_from(pixels.div_ceil(BLOCK as u64))
        .map_err(|_| invalid("resize launch: output too large"))?;
    let grid_y =
        u32::try_from(samples.len()).map_err(|_| invalid("resize launch: too many samples"))?;
    #[cfg(gf_host_kernels)]
    {
        // SAFETY: every valid sample's rows lie inside `src` (checked above; the kernel clamps
        // its taps to the image), `out` holds exactly the tensor the grid writes (checked),
        // and the slices outlive the call, which returns when every thread has run.
        unsafe {
            gf_host_resize(
                grid_x,
                grid_y,
                BLOCK,
                src.as_ptr(),
                samples.as_ptr(),
                emit,
                out.as_mut_ptr(),
            )
        };
        Ok(())
    }
    #[cfg(not(gf_host_kernels))]
    {
        let _ = (grid_x, grid_y);
        Err(unavailable())
    }
}

/// Runs `gf_crc32c` and `gf_crc32c_combine` over `spans` of `data`: one crc32c per span.
pub fn crc32c(data: &[u8], spans: &[GfSpan]) -> Result<Vec<u32>> {
    check_spans(data.len(), spans)?;
    let n = u32::try_from(spans.len()).map_err(|_| invalid("crc32c launch: too many spans"))?;
    let mut out = vec![0u32; spans.len()];
    if n == 0 {
        return Ok(out);
    }
    #[cfg(gf_host_kernels)]
    {
        let mut lanes = vec![0u32; spans.len() * super::kernels::CRC_LANES as usize];
        // SAFETY: every span lies inside `data` (checked), `lanes` holds CRC_LANES u32s per
        // span and `out` one, and the slices outlive the call.
        unsafe {
            gf_host_crc32c(
                data.as_ptr(),
                spans.as_ptr(),
                n,
                lanes.as_mut_ptr(),
                out.as_mut_ptr(),
            )
        };
        Ok(out)
    }
    #[cfg(not(gf_host_kernels))]
    {
        let _ = &mut out;
        Err(unavailable())
    }
}

#[cfg(all(test, gf_host_kernels))]
mod tests {
    use super::*;

    #[test]
    fn the_host_crc32c_kernel_is_crc32c_and_bounds_are_checked() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let spans = [
            GfSpan {
                offset: 0,
                len: 0,
                reserved: 0,
            },
            GfSpan {
                offset: 5,
                len: 4000,
                reserved: 0,
            },
            GfSpan {
                offset: 9000,
                len: 1000,
                reserved: 0,
            },
        ];
        // Lengths around the lanes' shares (128 lanes): empty lanes, one byte, partial last.
        let mut spans = spans.to_vec();
        for (k, len) in [1u32, 2, 127, 128, 129, 255, 256, 257, 383, 1000, 9_960]
            .into_iter()
            .enumerate()
        {
            spans.push(GfSpan {
                offset: k as u64 * 3,
                len,
                reserved: 0,
            });
        }
        let got = crc32c(&data, &spans).unwrap();
        for (s, c) in spans.iter().zip(got) {
            let r = s.offset as usize..s.offset as usize + s.len as usize;
            assert_eq!(c, crate::util::crc32c(&data[r]));
        }
        let past = GfSpan {
            offset: 9000,
            len: 1001,
            reserved: 0,
        };
        assert!(crc32c(&data, &[past]).is_err());
    }
}
