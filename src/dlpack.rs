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

/// What an exported tensor owns: the keeper of its memory, and its shape.
struct Ctx {
    _owner: Box<dyn Any + Send>,
    shape: [i64; 1],
    tensor: DLManagedTensor,
}

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
    let raw = Box::into_raw(Box::new(Ctx {
        _owner: owner,
        shape: [len as i64],
        tensor: DLManagedTensor {
            dl_tensor: DLTensor {
                data,
                device,
                ndim: 1,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(), // compact, row-major
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
