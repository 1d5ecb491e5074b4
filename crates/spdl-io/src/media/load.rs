//! Finding the FFmpeg backend: what the media API asks of FFmpeg ([`crate::backend::Backend`]) is done by
//! the code this module finds.
//!
//! With the `ffmpeg-linked` feature the backend is this crate's own `ffmpeg` module, linked against the FFmpeg
//! it was built with. With `ffmpeg` alone (the Python wheel), nothing of FFmpeg is linked: the first call that
//! needs it loads one of the backends built beside this library, `libspdl_ffmpeg{M}.so`, one per FFmpeg major
//! `M` (each is this crate built with `ffmpeg-linked` against that major's headers). It tries the newest major
//! whose libraries load (from the system's library path, or `SPDL_RS_FFMPEG_DIR`), and remembers the outcome.

use std::sync::OnceLock;

use crate::backend::Backend;
#[cfg(not(feature = "ffmpeg-linked"))]
use crate::backend::abi;
use crate::{Error, Result};

/// The FFmpeg majors a backend can be built for, newest first, with the sonames of their libraries in load
/// order (each after those it needs).
const MAJORS: &[(u32, [(&str, u32); 6])] = &[
    (8, [("avutil", 60), ("swresample", 6), ("swscale", 9), ("avcodec", 62), ("avformat", 62), ("avfilter", 11)]),
    (7, [("avutil", 59), ("swresample", 5), ("swscale", 8), ("avcodec", 61), ("avformat", 61), ("avfilter", 10)]),
    (6, [("avutil", 58), ("swresample", 4), ("swscale", 7), ("avcodec", 60), ("avformat", 60), ("avfilter", 9)]),
    (5, [("avutil", 57), ("swresample", 4), ("swscale", 6), ("avcodec", 59), ("avformat", 59), ("avfilter", 8)]),
    (4, [("avutil", 56), ("swresample", 3), ("swscale", 5), ("avcodec", 58), ("avformat", 58), ("avfilter", 7)]),
];

/// Where FFmpeg's libraries are looked for first (a directory holding `libavcodec.so.N` and the others,
/// or its `lib/`).
pub const FFMPEG_DIR_ENV: &str = "SPDL_RS_FFMPEG_DIR";
/// Where the `libspdl_ffmpeg{M}.so` backends are looked for first (default: beside the library or program
/// that holds this crate).
pub const BACKEND_DIR_ENV: &str = "SPDL_RS_FFMPEG_BACKEND_DIR";

/// What this process found of FFmpeg ([`ffmpeg_status`]).
#[derive(Debug, Clone, Default)]
pub struct FfmpegStatus {
    /// A backend is loaded (or linked in) and works.
    pub available: bool,
    /// The FFmpeg major in use.
    pub major: Option<u32>,
    /// `(library, version)` of the FFmpeg libraries in use.
    pub libraries: Vec<(String, String)>,
    /// `"linked"` (FFmpeg linked at build time), or the path of the backend that was loaded.
    pub backend: Option<String>,
    /// The FFmpeg majors this build has a backend for, newest first.
    pub backends: Vec<u32>,
    /// The FFmpeg majors whose libraries were found on this machine, newest first.
    pub found: Vec<u32>,
    /// Why FFmpeg is not available (what was looked for, what was found, how to install it).
    pub error: Option<String>,
}

/// What this process found of FFmpeg, loading a backend first if none was tried yet (it is never loaded
/// before a call that needs it, or this one).
///
/// ```
/// let status = spdl_io::media::ffmpeg_status();
/// assert_eq!(status.available, status.error.is_none());
/// ```
pub fn ffmpeg_status() -> FfmpegStatus {
    match loaded() {
        Ok(l) => FfmpegStatus {
            available: true,
            major: l.major,
            libraries: l.backend.versions(),
            backend: Some(l.origin.clone()),
            backends: l.backends.clone(),
            found: l.found.clone(),
            error: None,
        },
        Err(f) => FfmpegStatus {
            available: false,
            backends: f.backends.clone(),
            found: f.found.clone(),
            error: Some(f.message.clone()),
            ..Default::default()
        },
    }
}

/// The backend, loading it on first use.
///
/// Errors: [`Error::Unavailable`] naming FFmpeg, what was looked for and found, and how to install it.
pub(crate) fn backend() -> Result<&'static dyn Backend> {
    match loaded() {
        Ok(l) => Ok(l.backend),
        Err(f) => Err(Error::Unavailable { what: "FFmpeg".into(), detail: f.message.clone() }),
    }
}

struct Loaded {
    backend: &'static dyn Backend,
    major: Option<u32>,
    origin: String,
    backends: Vec<u32>,
    found: Vec<u32>,
}

struct Failure {
    message: String,
    backends: Vec<u32>,
    found: Vec<u32>,
}

static LOADED: OnceLock<std::result::Result<Loaded, Failure>> = OnceLock::new();

fn loaded() -> std::result::Result<&'static Loaded, &'static Failure> {
    LOADED.get_or_init(load).as_ref()
}

#[cfg(feature = "ffmpeg-linked")]
fn load() -> std::result::Result<Loaded, Failure> {
    let backend = crate::ffmpeg::linked();
    let major = backend
        .versions()
        .iter()
        .find(|(lib, _)| lib == "libavutil")
        .and_then(|(_, v)| v.split('.').next()?.parse::<u32>().ok())
        .and_then(|avutil| MAJORS.iter().find(|(_, libs)| libs[0].1 == avutil).map(|(m, _)| *m));
    let majors: Vec<u32> = major.into_iter().collect();
    Ok(Loaded { backend, major, origin: "linked".into(), backends: majors.clone(), found: majors })
}

#[cfg(not(feature = "ffmpeg-linked"))]
fn load() -> std::result::Result<Loaded, Failure> {
    dl::load()
}

/// Finding and loading a backend with the dynamic loader.
#[cfg(not(feature = "ffmpeg-linked"))]
mod dl {
    use std::ffi::{CStr, CString, c_void};
    use std::path::{Path, PathBuf};

    use super::{BACKEND_DIR_ENV, Backend, FFMPEG_DIR_ENV, Failure, Loaded, MAJORS, abi};

    /// The last dynamic-loader error, as text.
    fn dl_error() -> String {
        // SAFETY: dlerror returns null or a NUL-terminated message valid until the next dl* call on this
        // thread; it is copied at once.
        let p = unsafe { libc::dlerror() };
        if p.is_null() {
            return "unknown dynamic-loader error".into();
        }
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `dlopen(path, RTLD_NOW | RTLD_LOCAL)`: the handle (a library in use is never closed: what it holds stays
    /// referenced) or the loader's error.
    fn open(path: &str) -> Result<*mut c_void, String> {
        let c = CString::new(path).map_err(|_| format!("{path:?}: contains a NUL byte"))?;
        // SAFETY: a NUL-terminated path; the handle is kept for the life of the process.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() { Err(dl_error()) } else { Ok(h) }
    }

    /// Whether `path` loads (it is closed again).
    fn loads(path: &str) -> bool {
        match open(path) {
            Ok(h) => {
                // SAFETY: a handle from dlopen, closed once; nothing of the library was used.
                unsafe { libc::dlclose(h) };
                true
            }
            Err(_) => false,
        }
    }

    /// The directories the backends are looked for in: `$SPDL_RS_FFMPEG_BACKEND_DIR` alone when it is set,
    /// else the directory of the shared object (or program) that holds this code, then the program's.
    fn backend_dirs() -> Vec<PathBuf> {
        if let Some(d) = std::env::var_os(BACKEND_DIR_ENV) {
            return vec![PathBuf::from(d)];
        }
        let mut dirs = Vec::new();
        let mut info: libc::Dl_info = libc::Dl_info {
            dli_fname: std::ptr::null(),
            dli_fbase: std::ptr::null_mut(),
            dli_sname: std::ptr::null(),
            dli_saddr: std::ptr::null_mut(),
        };
        // SAFETY: dladdr fills `info` for an address inside a loaded object (this function's own code);
        // the file name it points at is owned by the loader and copied at once.
        let found = unsafe { libc::dladdr(backend_dirs as *const c_void, &mut info) } != 0;
        if found && !info.dli_fname.is_null() {
            // SAFETY: non-null, NUL-terminated (above).
            let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
            if let Some(dir) = Path::new(&name).parent().filter(|d| !d.as_os_str().is_empty()) {
                dirs.push(dir.to_path_buf());
            }
        }
        if let Some(dir) = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf)) {
            dirs.push(dir);
        }
        let mut seen = Vec::new();
        dirs.retain(|d| {
            let key = d.canonicalize().unwrap_or_else(|_| d.clone());
            let fresh = !seen.contains(&key);
            seen.push(key);
            fresh
        });
        dirs
    }

    /// The file of FFmpeg library `lib` with soname major `n`: under `$SPDL_RS_FFMPEG_DIR` (or its `lib/`)
    /// when that is set and has it, else the bare soname for the system's search path.
    fn library_file(lib: &str, n: u32) -> String {
        let name = format!("lib{lib}.so.{n}");
        if let Some(dir) = std::env::var_os(FFMPEG_DIR_ENV) {
            let dir = PathBuf::from(dir);
            for candidate in [dir.join(&name), dir.join("lib").join(&name)] {
                if candidate.is_file() {
                    return candidate.to_string_lossy().into_owned();
                }
            }
        }
        name
    }

    pub(super) fn load() -> Result<Loaded, Failure> {
        let dirs = backend_dirs();
        let backend_of =
            |major: u32| dirs.iter().map(|d| d.join(format!("libspdl_ffmpeg{major}.so"))).find(|p| p.is_file());
        let backends: Vec<(u32, PathBuf)> = MAJORS.iter().filter_map(|&(m, _)| backend_of(m).map(|p| (m, p))).collect();
        let majors: Vec<u32> = backends.iter().map(|(m, _)| *m).collect();
        // Which FFmpeg majors this machine has, for the message (libavutil is enough to tell); closed again, so
        // that a process on one FFmpeg does not keep another's libavutil mapped.
        let found: Vec<u32> =
            MAJORS.iter().filter(|(_, libs)| loads(&library_file(libs[0].0, libs[0].1))).map(|(m, _)| *m).collect();
        let mut tried: Vec<String> = Vec::new();
        for (major, path) in &backends {
            let Some((_, libs)) = MAJORS.iter().find(|(m, _)| m == major) else { continue };
            if let Some(missing) = libs.iter().find_map(|&(lib, n)| open(&library_file(lib, n)).err()) {
                tried.push(format!("FFmpeg {major}: {missing}"));
                continue;
            }
            match open_backend(path) {
                Ok(backend) => {
                    return Ok(Loaded {
                        backend,
                        major: Some(*major),
                        origin: path.display().to_string(),
                        backends: majors,
                        found,
                    });
                }
                Err(e) => tried.push(format!("FFmpeg {major}: {}: {e}", path.display())),
            }
        }
        Err(Failure { message: message(&dirs, &majors, &found, &tried), backends: majors, found })
    }

    /// Loads the backend at `path` and asks it for its entry point.
    fn open_backend(path: &Path) -> Result<&'static dyn Backend, String> {
        let handle = open(&path.to_string_lossy())?;
        let name = CString::new(abi::ENTRY).map_err(|e| e.to_string())?;
        // SAFETY: a valid handle and a NUL-terminated symbol name.
        let sym = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if sym.is_null() {
            return Err(format!("no {} in it ({})", abi::ENTRY, dl_error()));
        }
        // SAFETY: the symbol is the backend's entry point, exported with exactly this signature by
        // `abi::entry`'s wrapper.
        let entry: abi::EntryFn = unsafe { std::mem::transmute::<*mut c_void, abi::EntryFn>(sym) };
        let request = abi::Request::new();
        // SAFETY: `request` is valid for the call; the entry point checks the ABI and build id before it
        // reads anything else.
        let reply = unsafe { entry(&request) };
        if reply.is_null() {
            return Err(format!(
                "it was built by another build of spdl-rs (this one is {}); the backend and the module must come \
                 from the same build",
                abi::build_id()
            ));
        }
        // SAFETY: a non-null reply points at the backend's `&'static dyn Backend`, of this very build (the
        // build id matched), which lives as long as the never-closed library.
        Ok(unsafe { *reply.cast::<&'static dyn Backend>() })
    }

    fn list(majors: &[u32]) -> String {
        if majors.is_empty() {
            return "none".into();
        }
        majors.iter().map(|m| format!("FFmpeg {m}")).collect::<Vec<_>>().join(", ")
    }

    fn install_hint(major: u32) -> &'static str {
        match major {
            4 => "Debian 11 / Ubuntu 20.04: apt-get install libavcodec58 libavformat58 libavfilter7 libswscale5",
            5 => "Debian 12 / Ubuntu 22.04: apt-get install libavcodec59 libavformat59 libavfilter8 libswscale6",
            6 => "Ubuntu 24.04: apt-get install libavcodec60 libavformat60 libavfilter9 libswscale7",
            7 => "Debian 13: apt-get install libavcodec61 libavformat61 libavfilter10 libswscale8",
            _ => "your distribution's FFmpeg runtime packages (or `ffmpeg`)",
        }
    }

    fn message(dirs: &[PathBuf], majors: &[u32], found: &[u32], tried: &[String]) -> String {
        let looked: Vec<String> = MAJORS
            .iter()
            .filter(|(m, _)| majors.contains(m))
            .map(|(_, libs)| libs.iter().map(|(l, n)| format!("lib{l}.so.{n}")).collect::<Vec<_>>().join(" "))
            .collect();
        let mut msg = String::from("video and FFmpeg-only formats need FFmpeg's shared libraries. ");
        if majors.is_empty() {
            msg.push_str(&format!(
                "This build has no FFmpeg backend (no libspdl_ffmpeg*.so in {}; set {BACKEND_DIR_ENV} to where \
                 they are). ",
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ));
        } else {
            msg.push_str(&format!(
                "Looked for {} (the majors this build supports: {}); found on this machine: {}. ",
                looked.join("; "),
                list(majors),
                list(found)
            ));
            if !tried.is_empty() {
                msg.push_str(&format!("Tried: {}. ", tried.join("; ")));
            }
            let hints: Vec<&str> = majors.iter().map(|&m| install_hint(m)).collect();
            msg.push_str(&format!(
                "Install FFmpeg {} ({}), or set {FFMPEG_DIR_ENV} to a directory holding its libraries.",
                majors.iter().map(u32::to_string).collect::<Vec<_>>().join(" or "),
                hints.join("; ")
            ));
        }
        msg
    }
}
