//! The FFmpeg backend of spdl-io as a shared library: `libspdl_ffmpeg.so`, which `cargo xtask` builds once
//! per FFmpeg major against that major's headers and ships as `libspdl_ffmpeg{M}.so` beside the module that
//! loads it (the Python package's `_native`). It is spdl-io built with `ffmpeg-linked`, and exports one
//! entry point; spdl-io's `media` module finds it, checks that both come from the same build, and calls it.
//! See `spdl_io::media::ffmpeg_status` for what a process found.

/// The entry point the loader calls: a pointer to the backend, or null when `request` is of another build.
///
/// # Safety
/// `request` must be null or point at a valid `spdl_io::media::abi::Request`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spdl_ffmpeg_backend_v1(
    request: *const spdl_io::media::abi::Request,
) -> *const std::ffi::c_void {
    // SAFETY: forwarded from the caller.
    unsafe { spdl_io::media::abi::entry(request) }
}
