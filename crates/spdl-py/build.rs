//! Emits PyO3's cfgs (`Py_LIMITED_API`, `Py_3_11`, `Py_GIL_DISABLED`, ...) for the Python being built for, so
//! that the buffer protocol is compiled where that Python's ABI has it.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
