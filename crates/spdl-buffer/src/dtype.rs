use std::fmt;

/// Element type of a [`crate::Buffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// `u8`: image pixels, encoded bytes.
    U8,
    /// `i8`.
    I8,
    /// `u16`: 16-bit images.
    U16,
    /// `i16`: PCM audio.
    I16,
    /// `u32`.
    U32,
    /// `i32`: 32-bit PCM, labels.
    I32,
    /// `i64`: labels, indices.
    I64,
    /// `f32`: normalized images, float audio.
    F32,
    /// `f64`.
    F64,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The conventional short name (`"u8"`, `"f32"`, ...), as numpy's `dtype.name` minus the bit width words.
    pub const fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// True for floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// True for signed types (integers and floats).
    pub const fn is_signed(self) -> bool {
        !matches!(self, DType::U8 | DType::U16 | DType::U32)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be an element of a [`crate::Buffer`]: plain old data whose every bit pattern is valid.
///
/// Sealed: implemented for `u8, i8, u16, i16, u32, i32, i64, f32, f64`.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: DType = DType::$d; }
    )*};
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, i64 => I64, f32 => F32, f64 => F64);

/// What the axes of a [`crate::Buffer`] mean. Buffers are always contiguous and row-major; the layout
/// names the axes so consumers (numpy, DLPack, a model) know which is which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Layout {
    /// No named axes (a flat array, encoded bytes, labels).
    #[default]
    Plain,
    /// One image: height, width, channels.
    Hwc,
    /// One image: channels, height, width.
    Chw,
    /// A batch of images (or video frames): batch, height, width, channels.
    Nhwc,
    /// A batch of images: batch, channels, height, width.
    Nchw,
    /// One audio clip: channels, time.
    Ct,
    /// One audio clip, interleaved: time, channels.
    Tc,
    /// A batch of audio clips: batch, channels, time.
    Nct,
    /// A batch of interleaved audio clips: batch, time, channels.
    Ntc,
}

impl Layout {
    /// The axis letters, e.g. `"NHWC"`; empty for [`Layout::Plain`].
    pub const fn axes(self) -> &'static str {
        match self {
            Layout::Plain => "",
            Layout::Hwc => "HWC",
            Layout::Chw => "CHW",
            Layout::Nhwc => "NHWC",
            Layout::Nchw => "NCHW",
            Layout::Ct => "CT",
            Layout::Tc => "TC",
            Layout::Nct => "NCT",
            Layout::Ntc => "NTC",
        }
    }

    /// The layout of a batch of items with this layout (`Hwc` → `Nhwc`), or `Plain` if it has none.
    pub const fn batched(self) -> Layout {
        match self {
            Layout::Hwc => Layout::Nhwc,
            Layout::Chw => Layout::Nchw,
            Layout::Ct => Layout::Nct,
            Layout::Tc => Layout::Ntc,
            _ => Layout::Plain,
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Plain => f.write_str("plain"),
            other => f.write_str(other.axes()),
        }
    }
}
