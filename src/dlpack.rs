//! DLPack (the v0.8 ABI every framework reads): its structs, and exporting memory that an owner
//! keeps alive until the consumer calls the tensor's deleter. Used by the C ABI and the Python
//! package to hand batches to PyTorch, NumPy, CuPy or JAX without a copy.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// `kDLCPU`, `kDLCUDA`, …
    pub device_type: i32,
    /// The device ordinal (0 for the CPU).
    pub device_id: i32,
}

/// `kDLCPU`.
pub const KDL_CPU: i32 = 1;
/// `kDLCUDA`.
pub const KDL_CUDA: i32 = 2;

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// `kDLInt`, `kDLUInt`, `kDLFloat`, …
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element (1 for scalars).
    pub lanes: u16,
}

/// `uint8` (`kDLUInt`, 8 bits).
pub const UINT8: DLDataType = DLDataType {
    code: 1,
    bits: 8,
    lanes: 1,
};
/// `float16` (`kDLFloat`, 16 bits).
pub const FLOAT16: DLDataType = DLDataType {
    code: 2,
    bits: 16,
    lanes: 1,
};
/// `float32` (`kDLFloat`, 32 bits).
pub const FLOAT32: DLDataType = DLDataType {
    code: 2,
    bits: 32,
    lanes: 1,
};
/// `bfloat16` (`kDLBfloat`, 16 bits).
pub const BFLOAT16: DLDataType = DLDataType {
    code: 4,
    bits: 16,
    lanes: 1,
};
/// `int32` (`kDLInt`, 32 bits).
pub const INT32: DLDataType = DLDataType {
    code: 0,
    bits: 32,
    lanes: 1,
};
/// `int64` (`kDLInt`, 64 bits).
pub const INT64: DLDataType = DLDataType {
    code: 0,
    bits: 64,
    lanes: 1,
};

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// Start of the data (device memory for `kDLCUDA`).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or null for a compact row-major tensor.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context (what keeps the memory alive).
    pub manager_ctx: *mut c_void,
    /// Called by the consumer when it is done with the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What an exported tensor owns: the keeper of its memory, its shape and its strides.
struct Ctx {
    _owner: Box<dyn Any + Send>,
    shape: [i64; MAX_DIMS],
    strides: [i64; MAX_DIMS],
    tensor: DLManagedTensor,
}

/// The most dimensions [`export_nd`] takes.
pub const MAX_DIMS: usize = 4;

/// A 1-D tensor of `len` elements of `dtype` at `data` on `device`, whose memory `owner` keeps
/// alive until the returned tensor's deleter is called (exactly once, by the consumer).
///
/// # Safety
/// `data` must point to `len` elements valid for as long as `owner` lives.
pub unsafe fn export(
    owner: Box<dyn Any + Send>,
    data: *mut c_void,
    device: DLDevice,
    dtype: DLDataType,
    len: usize,
) -> *mut DLManagedTensor {
    // SAFETY: forwarded under the caller's promise (`len` elements, one dimension).
    unsafe { export_nd(owner, data, device, dtype, &[len as i64]) }
}

/// A compact row-major tensor of `shape` (at most [`MAX_DIMS`] extents; its strides are
/// given explicitly, in elements), otherwise as [`export`].
///
/// # Safety
/// `data` must point to `shape.iter().product()` elements valid for as long as `owner` lives.
pub unsafe fn export_nd(
    owner: Box<dyn Any + Send>,
    data: *mut c_void,
    device: DLDevice,
    dtype: DLDataType,
    shape: &[i64],
) -> *mut DLManagedTensor {
    assert!(
        !shape.is_empty() && shape.len() <= MAX_DIMS,
        "1 to {MAX_DIMS} dimensions"
    );
    let mut dims = [0i64; MAX_DIMS];
    dims[..shape.len()].copy_from_slice(shape);
    let mut strides = [0i64; MAX_DIMS];
    let mut step = 1;
    for d in (0..shape.len()).rev() {
        strides[d] = step;
        step *= shape[d].max(1);
    }
    let raw = Box::into_raw(Box::new(Ctx {
        _owner: owner,
        shape: dims,
        strides,
        tensor: DLManagedTensor {
            dl_tensor: DLTensor {
                data,
                device,
                ndim: shape.len() as i32,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete),
        },
    }));
    // SAFETY: `raw` is a live Box we own; the tensor points at its own context and shape,
    // which live exactly as long as it does.
    unsafe {
        (*raw).tensor.dl_tensor.shape = (*raw).shape.as_mut_ptr();
        (*raw).tensor.dl_tensor.strides = (*raw).strides.as_mut_ptr();
        (*raw).tensor.manager_ctx = raw as *mut c_void;
        &mut (*raw).tensor
    }
}

unsafe extern "C" fn delete(t: *mut DLManagedTensor) {
    if t.is_null() {
        return;
    }
    // SAFETY: `manager_ctx` is the Box made by `export`; DLPack calls the deleter once, giving
    // ownership back. A panic must not unwind into C.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
        drop(Box::from_raw((*t).manager_ctx as *mut Ctx))
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn export_keeps_the_owner_until_the_deleter() {
        let owner = Arc::new(vec![1u8, 2, 3]);
        let ptr = owner.as_ptr() as *mut c_void;
        let dev = DLDevice {
            device_type: KDL_CPU,
            device_id: 0,
        };
        // SAFETY: the owner keeps its 3 bytes alive.
        let t = unsafe { export(Box::new(owner.clone()), ptr, dev, UINT8, 3) };
        assert_eq!(Arc::strong_count(&owner), 2);
        // SAFETY: `t` is live until its deleter runs below.
        unsafe {
            assert_eq!((*t).dl_tensor.data, ptr);
            assert_eq!(*(*t).dl_tensor.shape, 3);
            assert_eq!((*t).dl_tensor.dtype, UINT8);
            ((*t).deleter.unwrap())(t);
        }
        assert_eq!(Arc::strong_count(&owner), 1);
    }
}
