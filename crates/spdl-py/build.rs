//! Emits PyO3's cfgs (`Py_LIMITED_API`, `Py_3_11`, `Py_GIL_DISABLED`, ...) for the Python being built for, so
//! that the buffer protocol is compiled where that Python's ABI has it; and says once, in a build without the
//! `ffmpeg` feature, that the module has no video and how to build it with video.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
    println!("cargo::rerun-if-env-changed=CARGO_FEATURE_FFMPEG");
    if std::env::var_os("CARGO_FEATURE_FFMPEG").is_none() {
        let hint = "`cargo xtask wheel` builds the wheel with every feature and its FFmpeg backends (FFmpeg is \
                    found at run time); `pip install ./crates/spdl-py` alone has neither";
        println!("cargo::warning=spdl_rs is built without video (spdl_rs.io.has_video() is False): {hint}");
    }
}
