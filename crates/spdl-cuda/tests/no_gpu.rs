//! Behaviour on machines without a usable GPU (CI, this build machine): typed errors, never a panic.
//! On a machine with a GPU these tests check the happy path of the same calls instead.

use spdl_buffer::dlpack::{DLDevice, DlpackTensor};
use spdl_buffer::{Buffer, Layout, system_allocator};
use spdl_cuda::{CudaDevice, Error, Transfer, TransferConfig, available, compiled_with_cuda, device_count};

#[test]
fn open_returns_a_typed_error_not_a_panic() {
    if available() {
        let dev = CudaDevice::open(0).expect("available() said a GPU can be used");
        assert_eq!(dev.index(), 0);
        let count = device_count().unwrap();
        match CudaDevice::open(count) {
            Err(Error::DeviceOutOfRange { index, count: c }) => assert_eq!((index, c), (count, count)),
            other => panic!("expected DeviceOutOfRange, got {other:?}"),
        }
        return;
    }
    // Several times: the driver probe is cached and stays an error, never a panic.
    for _ in 0..3 {
        let err = CudaDevice::open(0).unwrap_err();
        eprintln!("CudaDevice::open(0) without a GPU: {err}");
        if compiled_with_cuda() {
            assert!(
                matches!(err, Error::DriverNotFound | Error::NoDevice | Error::DriverPanicked { .. }),
                "unexpected error {err:?}"
            );
        } else {
            assert!(matches!(err, Error::NotCompiled), "unexpected error {err:?}");
            assert!(err.to_string().contains("--features cuda"));
        }
        if let Error::DriverNotFound = err {
            assert!(err.to_string().contains("libcuda"));
        }
        assert!(CudaDevice::open(7).is_err());
    }
    assert!(!available());
    match device_count() {
        Ok(0) => assert!(compiled_with_cuda()),
        Err(e) => assert!(e.is_unavailable(), "{e:?}"),
        Ok(n) => panic!("{n} devices but not available()"),
    }
}

#[test]
fn transfer_helper_falls_back_to_none() {
    let t = Transfer::open_if_available(&TransferConfig::default()).unwrap();
    assert_eq!(t.is_some(), available());
    if !available() {
        let err = Transfer::new(&TransferConfig::default()).unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
    }
}

#[test]
fn cpu_dlpack_export_works_in_every_build() {
    let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
    let buf = Buffer::from_slice(&data, &[2, 3, 4], Layout::Plain, &system_allocator()).unwrap();
    let t = DlpackTensor::from_buffer(buf).unwrap();
    assert_eq!(t.device(), DLDevice::CPU);
    assert_eq!(t.shape(), &[2, 3, 4]);
    // SAFETY: 24 f32 kept alive by `t`.
    let back = unsafe { std::slice::from_raw_parts(t.tensor().data as *const f32, 24) };
    assert_eq!(back, &data[..]);
}
