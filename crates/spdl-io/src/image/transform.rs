//! Geometric transforms: what region of the decoded image is resampled to what output size.
//!
//! Every transform is planned as one crop box (in source pixels, fractional) resampled to the output size in
//! a single `fast_image_resize` pass: "resize the shorter side to 256, then center-crop 224" is computed as a
//! resize of the matching source region straight to 224x224, which is the same image for less work.

use crate::image::rng::{SplitMix64, mix};
use crate::{Error, Result};

/// The resampling filter (all are antialiased convolutions when downscaling, as Pillow's and
/// torchvision's `antialias=True`, except [`ResizeFilter::Nearest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ResizeFilter {
    /// Nearest neighbour (no antialiasing; fastest).
    Nearest,
    /// Box (area average).
    Box,
    /// Bilinear (triangle): the usual training-loader choice.
    #[default]
    Bilinear,
    /// Hamming: bilinear speed, bicubic-like sharpness when downscaling.
    Hamming,
    /// Catmull-Rom bicubic.
    Bicubic,
    /// Mitchell–Netravali bicubic.
    Mitchell,
    /// Lanczos with a 3-lobe window: the sharpest, the slowest.
    Lanczos3,
}

impl ResizeFilter {
    pub(crate) fn algorithm(self) -> fast_image_resize::ResizeAlg {
        use fast_image_resize::{FilterType, ResizeAlg};
        match self {
            ResizeFilter::Nearest => ResizeAlg::Nearest,
            ResizeFilter::Box => ResizeAlg::Convolution(FilterType::Box),
            ResizeFilter::Bilinear => ResizeAlg::Convolution(FilterType::Bilinear),
            ResizeFilter::Hamming => ResizeAlg::Convolution(FilterType::Hamming),
            ResizeFilter::Bicubic => ResizeAlg::Convolution(FilterType::CatmullRom),
            ResizeFilter::Mitchell => ResizeAlg::Convolution(FilterType::Mitchell),
            ResizeFilter::Lanczos3 => ResizeAlg::Convolution(FilterType::Lanczos3),
        }
    }
}

/// What to do with the decoded image before it is written out.
///
/// Sizes are in pixels, after EXIF orientation (when [`crate::image::ImageOptions::exif_orientation`] is on).
///
/// ```
/// use spdl_io::image::{ResizeFilter, Transform};
/// // The ImageNet evaluation recipe: shorter side to 256, center crop 224x224, bilinear.
/// assert_eq!(
///     Transform::imagenet_eval(),
///     Transform::ResizeShorterCenterCrop { shorter: 256, crop_width: 224, crop_height: 224, filter: ResizeFilter::Bilinear }
/// );
/// assert_eq!(Transform::resize(224, 224).output_size(), Some((224, 224)));
/// assert_eq!(Transform::None.output_size(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum Transform {
    /// Keep the decoded size.
    #[default]
    None,
    /// Resize to exactly `width` x `height` (the aspect ratio is not kept).
    Resize {
        /// Output width.
        width: u32,
        /// Output height.
        height: u32,
        /// Resampling filter.
        filter: ResizeFilter,
    },
    /// Resize so that the shorter side is `shorter` (aspect ratio kept), then cut the centered
    /// `crop_width` x `crop_height` region: torchvision's `Resize(256)` + `CenterCrop(224)`.
    ResizeShorterCenterCrop {
        /// Length of the shorter side after the resize.
        shorter: u32,
        /// Output width (at most `shorter`).
        crop_width: u32,
        /// Output height (at most `shorter`).
        crop_height: u32,
        /// Resampling filter.
        filter: ResizeFilter,
    },
    /// torchvision's `RandomResizedCrop`: a random region covering a `scale` fraction of the area with an
    /// aspect ratio in `ratio`, resized to `width` x `height`. Deterministic for a given `seed` (in a batch,
    /// item `i` uses the seed mixed with `i`; change the seed every epoch to get new crops).
    RandomResizedCrop {
        /// Output width.
        width: u32,
        /// Output height.
        height: u32,
        /// Range of the crop's area as a fraction of the image area (torchvision: `(0.08, 1.0)`).
        scale: (f64, f64),
        /// Range of the crop's aspect ratio, width / height (torchvision: `(3/4, 4/3)`).
        ratio: (f64, f64),
        /// Seed of the crop position and size.
        seed: u64,
        /// Probability of flipping the output horizontally (torchvision's `RandomHorizontalFlip(p)`), drawn
        /// from the same per-item generator after the crop. `0.0`: never.
        hflip: f64,
        /// Resampling filter.
        filter: ResizeFilter,
    },
}

/// A transform a recipe names by string (`spdl demo --transform`, `spdl_rs`'s `transform=`), parsed in
/// one place, and the [`Transform`] it stands for at a given output size.
///
/// ```
/// use spdl_io::image::{ResizeFilter, Transform, TransformName};
/// let name: TransformName = "center-crop".parse().unwrap();
/// let t = name.transform(224, 224, ResizeFilter::Bilinear, 0);
/// assert!(matches!(t, Transform::ResizeShorterCenterCrop { shorter: 256, crop_width: 224, .. }));
/// assert!("crop".parse::<TransformName>().unwrap_err().to_string().contains("center-crop"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransformName {
    /// `"resize"`: exactly to the output size ([`Transform::Resize`]).
    Resize,
    /// `"center-crop"`: ImageNet's evaluation transform, the shorter side to 256/224 of the output's longer
    /// side, then the centered output-sized crop ([`Transform::ResizeShorterCenterCrop`]).
    CenterCrop,
    /// `"random-resized-crop"`: torchvision's `RandomResizedCrop` with a horizontal flip half the time
    /// ([`Transform::RandomResizedCrop`]), seeded.
    RandomResizedCrop,
}

impl TransformName {
    /// Every name, as parsed.
    pub const NAMES: [&'static str; 3] = ["resize", "center-crop", "random-resized-crop"];

    /// The name as parsed.
    pub fn as_str(self) -> &'static str {
        match self {
            TransformName::Resize => "resize",
            TransformName::CenterCrop => "center-crop",
            TransformName::RandomResizedCrop => "random-resized-crop",
        }
    }

    /// The transform to a `width` x `height` output, resampled with `filter`; `seed` seeds the random crop.
    pub fn transform(self, width: u32, height: u32, filter: ResizeFilter, seed: u64) -> Transform {
        match self {
            TransformName::Resize => Transform::Resize { width, height, filter },
            TransformName::CenterCrop => Transform::ResizeShorterCenterCrop {
                shorter: u32::try_from((u64::from(width.max(height)) * 256).div_ceil(224)).unwrap_or(u32::MAX),
                crop_width: width,
                crop_height: height,
                filter,
            },
            TransformName::RandomResizedCrop => match Transform::random_resized_crop(width, height, seed) {
                Transform::RandomResizedCrop { scale, ratio, seed, .. } => {
                    Transform::RandomResizedCrop { width, height, scale, ratio, seed, hflip: 0.5, filter }
                }
                other => other,
            },
        }
    }
}

impl std::fmt::Display for TransformName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transform name that is not one of [`TransformName::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transform must be \"resize\", \"center-crop\" or \"random-resized-crop\", got {0:?}")]
pub struct UnknownTransform(pub String);

impl std::str::FromStr for TransformName {
    type Err = UnknownTransform;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "resize" => Ok(TransformName::Resize),
            "center-crop" => Ok(TransformName::CenterCrop),
            "random-resized-crop" => Ok(TransformName::RandomResizedCrop),
            other => Err(UnknownTransform(other.to_owned())),
        }
    }
}

impl Transform {
    /// [`Transform::Resize`] with the bilinear filter.
    pub fn resize(width: u32, height: u32) -> Transform {
        Transform::Resize { width, height, filter: ResizeFilter::Bilinear }
    }

    /// The ImageNet evaluation transform: shorter side 256, center crop 224x224, bilinear.
    pub fn imagenet_eval() -> Transform {
        Transform::ResizeShorterCenterCrop {
            shorter: 256,
            crop_width: 224,
            crop_height: 224,
            filter: ResizeFilter::Bilinear,
        }
    }

    /// [`Transform::RandomResizedCrop`] with torchvision's defaults (scale 0.08–1, ratio 3/4–4/3, bilinear).
    pub fn random_resized_crop(width: u32, height: u32, seed: u64) -> Transform {
        Transform::RandomResizedCrop {
            width,
            height,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            seed,
            hflip: 0.0,
            filter: ResizeFilter::Bilinear,
        }
    }

    /// The ImageNet training transform: [`Transform::random_resized_crop`] to `size` x `size` and a
    /// horizontal flip with probability 1/2 (torchvision's `RandomResizedCrop(size)` +
    /// `RandomHorizontalFlip()`), seeded by `seed` and the item's key.
    pub fn imagenet_train(size: u32, seed: u64) -> Transform {
        match Transform::random_resized_crop(size, size, seed) {
            Transform::RandomResizedCrop { width, height, scale, ratio, seed, filter, .. } => {
                Transform::RandomResizedCrop { width, height, scale, ratio, seed, hflip: 0.5, filter }
            }
            other => other,
        }
    }

    /// The fixed output size `(width, height)`, or `None` for [`Transform::None`].
    pub fn output_size(&self) -> Option<(u32, u32)> {
        match *self {
            Transform::None => None,
            Transform::Resize { width, height, .. } | Transform::RandomResizedCrop { width, height, .. } => {
                Some((width, height))
            }
            Transform::ResizeShorterCenterCrop { crop_width, crop_height, .. } => Some((crop_width, crop_height)),
        }
    }

    pub(crate) fn filter(&self) -> ResizeFilter {
        match *self {
            Transform::None => ResizeFilter::default(),
            Transform::Resize { filter, .. }
            | Transform::ResizeShorterCenterCrop { filter, .. }
            | Transform::RandomResizedCrop { filter, .. } => filter,
        }
    }

    /// Checks the parameters (sizes non-zero, crop within the resized image, sane ranges).
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidOptions(msg));
        match *self {
            Transform::None => Ok(()),
            Transform::Resize { width, height, .. } if width == 0 || height == 0 => {
                bad(format!("resize to {width}x{height}: sizes must be at least 1"))
            }
            Transform::Resize { .. } => Ok(()),
            Transform::ResizeShorterCenterCrop { shorter, crop_width, crop_height, .. } => {
                if shorter == 0 || crop_width == 0 || crop_height == 0 {
                    bad(format!("shorter side {shorter}, crop {crop_width}x{crop_height}: sizes must be at least 1"))
                } else if crop_width > shorter || crop_height > shorter {
                    bad(format!("center crop {crop_width}x{crop_height} is larger than the shorter side {shorter}"))
                } else {
                    Ok(())
                }
            }
            Transform::RandomResizedCrop { hflip, .. } if !(0.0..=1.0).contains(&hflip) => {
                bad(format!("random resized crop hflip {hflip}: a probability in 0..=1"))
            }
            Transform::RandomResizedCrop { width, height, scale, ratio, .. } => {
                if width == 0 || height == 0 {
                    bad(format!("random resized crop to {width}x{height}: sizes must be at least 1"))
                } else if !(scale.0 > 0.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
                    bad(format!("random resized crop scale {scale:?}: need 0 < min <= max <= 1"))
                } else if !(ratio.0 > 0.0 && ratio.0 <= ratio.1 && ratio.1.is_finite()) {
                    bad(format!("random resized crop ratio {ratio:?}: need 0 < min <= max"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Plans the transform on a `src_w` x `src_h` image. `salt` decorrelates random crops (the batch index).
    pub(crate) fn plan(&self, src_w: u32, src_h: u32, salt: u64) -> Option<Plan> {
        let (w, h) = (f64::from(src_w), f64::from(src_h));
        match *self {
            Transform::None => None,
            Transform::Resize { width, height, .. } => {
                Some(Plan { left: 0.0, top: 0.0, width: w, height: h, out_w: width, out_h: height, flip: false })
            }
            Transform::ResizeShorterCenterCrop { shorter, crop_width, crop_height, .. } => {
                // As torchvision: the longer side is truncated to an integer, the crop offset is rounded.
                let s = f64::from(shorter);
                let (rw, rh) = if src_w <= src_h { (s, (s * h / w).floor()) } else { ((s * w / h).floor(), s) };
                let (rw, rh) = (rw.max(1.0), rh.max(1.0));
                let (cw, ch) = (f64::from(crop_width), f64::from(crop_height));
                let left = ((rw - cw) / 2.0).round().max(0.0);
                let top = ((rh - ch) / 2.0).round().max(0.0);
                let (sx, sy) = (w / rw, h / rh);
                Some(Plan {
                    left: left * sx,
                    top: top * sy,
                    width: (cw * sx).min(w - left * sx),
                    height: (ch * sy).min(h - top * sy),
                    out_w: crop_width,
                    out_h: crop_height,
                    flip: false,
                })
            }
            Transform::RandomResizedCrop { width, height, scale, ratio, seed, hflip, .. } => {
                let mut rng = SplitMix64::new(mix(seed, salt));
                let (left, top, cw, ch) = random_crop(&mut rng, src_w, src_h, scale, ratio);
                let flip = hflip > 0.0 && rng.uniform(0.0, 1.0) < hflip;
                Some(Plan {
                    left: f64::from(left),
                    top: f64::from(top),
                    width: f64::from(cw),
                    height: f64::from(ch),
                    out_w: width,
                    out_h: height,
                    flip,
                })
            }
        }
    }
}

/// torchvision's `RandomResizedCrop.get_params`: returns `(left, top, width, height)` in whole pixels.
fn random_crop(rng: &mut SplitMix64, w: u32, h: u32, scale: (f64, f64), ratio: (f64, f64)) -> (u32, u32, u32, u32) {
    let area = f64::from(w) * f64::from(h);
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * rng.uniform(scale.0, scale.1.max(scale.0 + f64::MIN_POSITIVE));
        let aspect = rng.uniform(lr0, lr1.max(lr0 + f64::MIN_POSITIVE)).exp();
        let cw = (target * aspect).sqrt().round();
        let ch = (target / aspect).sqrt().round();
        if cw >= 1.0 && ch >= 1.0 && cw <= f64::from(w) && ch <= f64::from(h) {
            let (cw, ch) = (cw as u32, ch as u32);
            let top = rng.below(u64::from(h - ch) + 1) as u32;
            let left = rng.below(u64::from(w - cw) + 1) as u32;
            return (left, top, cw, ch);
        }
    }
    // Fallback: the whole image, cut to the nearest allowed aspect ratio, centered.
    let in_ratio = f64::from(w) / f64::from(h);
    let (cw, ch) = if in_ratio < ratio.0 {
        (w, ((f64::from(w) / ratio.0).round() as u32).clamp(1, h))
    } else if in_ratio > ratio.1 {
        (((f64::from(h) * ratio.1).round() as u32).clamp(1, w), h)
    } else {
        (w, h)
    };
    ((w - cw) / 2, (h - ch) / 2, cw, ch)
}

/// One resampling pass: the crop box in source pixels and the output size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Plan {
    pub(crate) left: f64,
    pub(crate) top: f64,
    pub(crate) width: f64,
    pub(crate) height: f64,
    pub(crate) out_w: u32,
    pub(crate) out_h: u32,
    /// Mirror the output left to right.
    pub(crate) flip: bool,
}

impl Plan {
    /// True if the plan copies a `src_w` x `src_h` image unchanged.
    pub(crate) fn is_identity(&self, src_w: u32, src_h: u32) -> bool {
        self.left == 0.0
            && self.top == 0.0
            && self.width == f64::from(src_w)
            && self.height == f64::from(src_h)
            && self.out_w == src_w
            && self.out_h == src_h
            && !self.flip
    }

    /// The same plan on an image scaled by `(sx, sy)` (a reduced-scale decode).
    pub(crate) fn scaled(&self, sx: f64, sy: f64, src_w: u32, src_h: u32) -> Plan {
        let left = self.left * sx;
        let top = self.top * sy;
        Plan {
            left,
            top,
            width: (self.width * sx).min(f64::from(src_w) - left),
            height: (self.height * sy).min(f64::from(src_h) - top),
            ..*self
        }
    }

    /// How many times the crop is larger than the output along its tighter axis (>= 1 means downscaling).
    pub(crate) fn shrink(&self) -> f64 {
        (self.width / f64::from(self.out_w)).min(self.height / f64::from(self.out_h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorter_center_crop_matches_torchvision() {
        // 500x375 -> shorter 256 -> 341x256 -> crop 224 at left=round(58.5)=58 (banker's? no: half away), top=16.
        let p = Transform::imagenet_eval().plan(500, 375, 0).unwrap();
        let s = 375.0 / 256.0;
        let rw = (256.0f64 * 500.0 / 375.0).floor();
        assert_eq!(rw, 341.0);
        assert!((p.left - ((341.0f64 - 224.0) / 2.0).round() * (500.0 / rw)).abs() < 1e-9);
        assert!((p.top - 16.0 * s).abs() < 1e-9);
        assert!((p.height - 224.0 * s).abs() < 1e-9);
        assert_eq!((p.out_w, p.out_h), (224, 224));
        // Portrait and square.
        let p = Transform::imagenet_eval().plan(300, 600, 0).unwrap();
        assert!(p.left > 0.0 && p.top > 0.0 && p.left + p.width <= 300.0 && p.top + p.height <= 600.0);
        let p = Transform::imagenet_eval().plan(256, 256, 0).unwrap();
        assert_eq!((p.left, p.top, p.width, p.height), (16.0, 16.0, 224.0, 224.0));
    }

    #[test]
    fn random_crop_is_seeded_inside_and_in_range() {
        let t = Transform::random_resized_crop(224, 224, 42);
        let a = t.plan(500, 375, 3).unwrap();
        assert_eq!(a, t.plan(500, 375, 3).unwrap());
        assert_ne!(a, t.plan(500, 375, 4).unwrap());
        for salt in 0..2000 {
            let p = t.plan(500, 375, salt).unwrap();
            assert!(p.left >= 0.0 && p.top >= 0.0 && p.width >= 1.0 && p.height >= 1.0);
            assert!(p.left + p.width <= 500.0 && p.top + p.height <= 375.0, "{p:?}");
            let area = p.width * p.height / (500.0 * 375.0);
            assert!((0.07..=1.0).contains(&area), "{area}");
        }
        // Tiny and extreme images still give a valid crop (the fallback path).
        for (w, h) in [(1, 1), (1, 1000), (1000, 1), (3, 2)] {
            let p = t.plan(w, h, 9).unwrap();
            assert!(
                p.width >= 1.0
                    && p.height >= 1.0
                    && p.left + p.width <= f64::from(w)
                    && p.top + p.height <= f64::from(h)
            );
        }
    }

    #[test]
    fn validation() {
        assert!(Transform::resize(0, 4).validate().is_err());
        assert!(
            Transform::ResizeShorterCenterCrop {
                shorter: 200,
                crop_width: 224,
                crop_height: 224,
                filter: ResizeFilter::Bilinear
            }
            .validate()
            .is_err()
        );
        let mut t = Transform::random_resized_crop(8, 8, 0);
        assert!(t.validate().is_ok());
        if let Transform::RandomResizedCrop { scale, .. } = &mut t {
            *scale = (0.5, 0.1);
        }
        assert!(t.validate().is_err());
        assert!(Transform::None.validate().is_ok());
    }

    #[test]
    fn scaled_plan_and_shrink() {
        let p = Transform::resize(100, 50).plan(400, 300, 0).unwrap();
        assert_eq!(p.shrink(), 4.0);
        let q = p.scaled(0.5, 0.5, 200, 150);
        assert_eq!((q.width, q.height, q.out_w), (200.0, 150.0, 100));
        assert!(Transform::resize(4, 3).plan(4, 3, 0).unwrap().is_identity(4, 3));
    }
}

#[cfg(test)]
mod distribution_tests {
    use super::*;

    /// Over 100,000 items, the crop's area fraction and log aspect ratio follow torchvision's
    /// `RandomResizedCrop.get_params`: both drawn uniformly, a draw kept only if the crop fits in the image
    /// (else drawn again). The expected histograms are integrated numerically from that definition (the
    /// region of uniform draws that fit); the flip comes up half the time.
    #[test]
    fn random_resized_crop_follows_torchvisions_distribution() {
        let t = Transform::imagenet_train(224, 11);
        let (w, h) = (2000u32, 2000u32);
        let n = 100_000u64;
        let (mut area, mut aspect, mut flips) = ([0u64; 10], [0u64; 10], 0u64);
        let (lr0, lr1) = ((3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln());
        for key in 0..n {
            let p = t.plan(w, h, key).unwrap_or_else(|| panic!("plan"));
            let frac = p.width * p.height / f64::from(w * h);
            let a = ((frac - 0.08) / 0.92 * 10.0).floor().clamp(0.0, 9.0) as usize;
            let r = (((p.width / p.height).ln() - lr0) / (lr1 - lr0) * 10.0).floor().clamp(0.0, 9.0) as usize;
            area[a] += 1;
            aspect[r] += 1;
            flips += u64::from(p.flip);
        }
        // Expected: uniform on (area, log aspect), restricted to crops that fit a square (f * e^|l| <= 1).
        let (mut want_area, mut want_aspect, mut total) = ([0f64; 10], [0f64; 10], 0f64);
        let g = 1000;
        for i in 0..g {
            let f = 0.08 + 0.92 * (f64::from(i) + 0.5) / f64::from(g);
            for j in 0..g {
                let l = lr0 + (lr1 - lr0) * (f64::from(j) + 0.5) / f64::from(g);
                if f * l.abs().exp() <= 1.0 {
                    want_area[(i * 10 / g) as usize] += 1.0;
                    want_aspect[(j * 10 / g) as usize] += 1.0;
                    total += 1.0;
                }
            }
        }
        // Each bin within ~5 standard deviations of its expected count (sd <= 100 for n = 100k).
        for (name, hist, want) in [("area", area, want_area), ("aspect", aspect, want_aspect)] {
            for (i, (&c, &p)) in hist.iter().zip(&want).enumerate() {
                let expected = p / total * n as f64;
                assert!((c as f64 - expected).abs() < 500.0, "{name} bin {i}: {c}, expected {expected:.0} ({hist:?})");
            }
        }
        assert!(flips.abs_diff(n / 2) < 800, "{flips} flips of {n}");
        // Not a function of the batch position: the key decides.
        assert_eq!(t.plan(w, h, 5), t.plan(w, h, 5));
        assert_ne!(t.plan(w, h, 5), t.plan(w, h, 6));
    }
}
