//! Packets as bytes and back ([`crate::media::MediaPackets::serialize`]): what SPDL's pickling and
//! `deserialize_view` carry between processes.
//!
//! The layout (little-endian) is a header, then the packet data:
//!
//! ```text
//! "SPDLPKT1" | u64 header length | header | zeros to a 64-byte boundary | data
//! header: kind, item, window, limits, time base, frame rate, codec parameters (extradata included),
//!         then per packet: pts, dts, duration, pos, flags, data offset, data size, side data
//! data:   each packet's bytes at a 64-byte-aligned offset, followed by at least
//!         AV_INPUT_BUFFER_PADDING_SIZE zero bytes
//! ```
//!
//! The zeroed padding after every packet is what FFmpeg's decoders require of their input, so a view
//! ([`deserialize`] with a keeper) points FFmpeg's packets straight into the serialized bytes: each packet
//! holds an `AVBufferRef` whose free callback drops one reference to the memory's keeper.
//!
//! Reading checks every length and offset against the bytes it has, and every enumerated value against
//! FFmpeg's ranges, so truncated or damaged bytes are an error, never a read out of bounds.

use std::ffi::{CStr, CString, c_void};
use std::sync::Arc;

use ff::ffi;
use ff::packet::{Mut as _, Ref as _};
use ffmpeg_next as ff;

use super::media::{Params, codec_from_params, ff_packet, params_of, wrap_packet};
use crate::types::media::{MediaPackets, MediaType, SharedBytes};
use crate::types::video::VideoLimits;
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"SPDLPKT1";
const ALIGN: usize = 64;
const PADDING: usize = ffi::AV_INPUT_BUFFER_PADDING_SIZE as usize;

fn damaged(item: &str, cause: impl Into<String>) -> Error {
    Error::Decode { item: item.to_owned(), format: "serialized packets".into(), cause: cause.into().into() }
}

// ------------------------------------------------------------------------------------------------ writing

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
    }
}

/// An enumerated field of an FFmpeg struct, as the integer C stores.
macro_rules! as_int {
    ($e:expr) => {
        $e as i32
    };
}

fn write_params(w: &mut Writer, params: &ff::codec::Parameters) {
    // SAFETY: `params` owns a valid AVCodecParameters; only its fields are read, and extradata is read
    // within the `extradata_size` bytes FFmpeg allocated for it.
    unsafe {
        let p = params.as_ptr();
        let desc = ffi::avcodec_descriptor_get((*p).codec_id);
        let name = if desc.is_null() { &[][..] } else { CStr::from_ptr((*desc).name).to_bytes() };
        w.bytes(name);
        w.u32((*p).codec_tag);
        let extra = match usize::try_from((*p).extradata_size) {
            Ok(n) if n > 0 && !(*p).extradata.is_null() => std::slice::from_raw_parts((*p).extradata, n),
            _ => &[],
        };
        w.bytes(extra);
        for v in [
            (*p).format,
            (*p).bits_per_coded_sample,
            (*p).bits_per_raw_sample,
            (*p).profile,
            (*p).level,
            (*p).width,
            (*p).height,
            (*p).sample_aspect_ratio.num,
            (*p).sample_aspect_ratio.den,
            as_int!((*p).field_order),
            as_int!((*p).color_range),
            as_int!((*p).color_primaries),
            as_int!((*p).color_trc),
            as_int!((*p).color_space),
            as_int!((*p).chroma_location),
            (*p).video_delay,
            as_int!((*p).ch_layout.order),
            (*p).ch_layout.nb_channels,
            (*p).sample_rate,
            (*p).block_align,
            (*p).frame_size,
            (*p).initial_padding,
            (*p).trailing_padding,
            (*p).seek_preroll,
        ] {
            w.i32(v);
        }
        let native = matches!(
            (*p).ch_layout.order,
            ffi::AVChannelOrder::AV_CHANNEL_ORDER_NATIVE | ffi::AVChannelOrder::AV_CHANNEL_ORDER_AMBISONIC
        );
        w.u64(if native { (*p).ch_layout.u.mask } else { 0 });
        w.i64((*p).bit_rate);
    }
}

/// `packets` as bytes (the layout in this module's documentation).
pub(crate) fn serialize(packets: &MediaPackets) -> Result<Vec<u8>> {
    let item = packets.item.as_str();
    let mut h = Writer(Vec::new());
    h.u8(match packets.codec.kind {
        MediaType::Audio => 0,
        MediaType::Video => 1,
        MediaType::Image => 2,
    });
    h.bytes(item.as_bytes());
    match packets.window {
        None => h.u8(0),
        Some((s, e)) => {
            h.u8(1);
            h.f64(s);
            h.f64(e);
        }
    }
    let l = &packets.limits;
    for v in [l.max_packets, l.max_packet_bytes, l.max_frames, l.max_pixels, l.max_output_bytes] {
        h.u64(v);
    }
    h.u32(l.max_bad_packets);
    let c = &packets.codec;
    for v in [c.time_base.0, c.time_base.1, c.frame_rate.0, c.frame_rate.1] {
        h.i32(v);
    }
    write_params(&mut h, &params_of(c)?.0);
    h.u64(packets.packets.len() as u64);
    // Data offsets are relative to the start of the data region; the header does not know its own size.
    let mut data_len = 0usize;
    let mut spans = Vec::with_capacity(packets.packets.len());
    for p in &packets.packets {
        let pkt = ff_packet(p, item)?;
        let data = pkt.data().unwrap_or(&[]);
        spans.push((data_len, data));
        // SAFETY: `pkt` is a valid AVPacket; its side data array holds `side_data_elems` entries, each
        // with `size` bytes at `data`.
        unsafe {
            let raw = pkt.as_ptr();
            h.i64((*raw).pts);
            h.i64((*raw).dts);
            h.i64((*raw).duration);
            h.i64((*raw).pos);
            h.i32((*raw).flags);
            h.u64(data_len as u64);
            h.u64(data.len() as u64);
            let n = usize::try_from((*raw).side_data_elems).unwrap_or(0);
            h.u32(n as u32);
            for i in 0..n {
                let sd = &*(*raw).side_data.add(i);
                h.i32(as_int!(sd.type_));
                let bytes = if sd.data.is_null() { &[][..] } else { std::slice::from_raw_parts(sd.data, sd.size) };
                h.bytes(bytes);
            }
        }
        data_len = (data_len + data.len() + PADDING).next_multiple_of(ALIGN);
    }
    let data_start = (MAGIC.len() + 8 + h.0.len()).next_multiple_of(ALIGN);
    let total = data_start.checked_add(data_len).ok_or_else(|| damaged(item, "too large to serialize"))?;
    let mut out = Vec::new();
    out.try_reserve_exact(total)
        .map_err(|_| damaged(item, format!("cannot allocate {total} bytes to serialize the packets")))?;
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(h.0.len() as u64).to_le_bytes());
    out.extend_from_slice(&h.0);
    out.resize(data_start, 0);
    for (off, data) in spans {
        out.resize(data_start + off, 0);
        out.extend_from_slice(data);
    }
    out.resize(total, 0);
    Ok(out)
}

// ------------------------------------------------------------------------------------------------ reading

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    item: String,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            damaged(&self.item, format!("truncated: {n} bytes wanted at byte {} of {}", self.pos, self.buf.len()))
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.arr()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.arr()?))
    }
    fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        usize::try_from(n).ok().filter(|&n| n <= self.buf.len()).ok_or_else(|| {
            damaged(&self.item, format!("a length of {n} bytes in {} bytes of serialized packets", self.buf.len()))
        })
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
    }
}

/// Writes `v` into the C enum at `field` if `ok(v)`, else an error naming `what`.
///
/// # Safety
/// `field` must point to a C enum field (an `int`) of a live struct, and `ok` must accept only values that
/// the enum's Rust binding declares.
unsafe fn set_enum<T>(field: *mut T, v: i32, ok: bool, what: &str, item: &str) -> Result<()> {
    const { assert!(std::mem::size_of::<T>() == std::mem::size_of::<i32>()) };
    if !ok {
        return Err(damaged(item, format!("{what} {v} is not one of FFmpeg's")));
    }
    // SAFETY: the caller's contract; the enum is an `int` and `v` is one of its declared values.
    unsafe { field.cast::<i32>().write(v) };
    Ok(())
}

fn read_params(r: &mut Reader<'_>, kind: MediaType) -> Result<ff::codec::Parameters> {
    let item = r.item.clone();
    let name = r.bytes()?;
    let tag = r.u32()?;
    let extra = r.bytes()?;
    let mut ints = [0i32; 24];
    for v in &mut ints {
        *v = r.i32()?;
    }
    let mask = r.u64()?;
    let bit_rate = r.i64()?;
    let [
        format,
        bits_coded,
        bits_raw,
        profile,
        level,
        width,
        height,
        sar_num,
        sar_den,
        field_order,
        color_range,
        color_primaries,
        color_trc,
        color_space,
        chroma_location,
        video_delay,
        ch_order,
        nb_channels,
        sample_rate,
        block_align,
        frame_size,
        initial_padding,
        trailing_padding,
        seek_preroll,
    ] = ints;
    let mut params = ff::codec::Parameters::new();
    // SAFETY: `params` owns a freshly allocated AVCodecParameters (zeroed, defaults set by FFmpeg), written
    // field by field; enum fields only with values their bindings declare (`set_enum`), extradata with an
    // FFmpeg allocation of the size recorded plus FFmpeg's zeroed padding.
    unsafe {
        let p = params.as_mut_ptr();
        (*p).codec_type = match kind {
            MediaType::Audio => ffi::AVMediaType::AVMEDIA_TYPE_AUDIO,
            MediaType::Video | MediaType::Image => ffi::AVMediaType::AVMEDIA_TYPE_VIDEO,
        };
        if !name.is_empty() {
            let cname = CString::new(name).map_err(|_| damaged(&item, "a codec name with a NUL byte"))?;
            let desc = ffi::avcodec_descriptor_get_by_name(cname.as_ptr());
            if desc.is_null() {
                return Err(damaged(&item, format!("codec {:?} is not known to this FFmpeg", cname)));
            }
            (*p).codec_id = (*desc).id;
        }
        (*p).codec_tag = tag;
        if !extra.is_empty() {
            let n = i32::try_from(extra.len()).map_err(|_| damaged(&item, "extradata over 2 GiB"))?;
            let buf = ffi::av_mallocz(extra.len() + PADDING).cast::<u8>();
            if buf.is_null() {
                return Err(damaged(&item, format!("cannot allocate {} bytes of extradata", extra.len())));
            }
            std::ptr::copy_nonoverlapping(extra.as_ptr(), buf, extra.len());
            (*p).extradata = buf;
            (*p).extradata_size = n;
        }
        (*p).format = format;
        (*p).bits_per_coded_sample = bits_coded;
        (*p).bits_per_raw_sample = bits_raw;
        (*p).profile = profile;
        (*p).level = level;
        (*p).width = width;
        (*p).height = height;
        (*p).sample_aspect_ratio = ffi::AVRational { num: sar_num, den: sar_den };
        let nb = |n: u32| 0..n as i32;
        set_enum(&raw mut (*p).field_order, field_order, (0..=5).contains(&field_order), "field order", &item)?;
        let ranges = nb(ffi::AVColorRange::AVCOL_RANGE_NB as u32);
        set_enum(&raw mut (*p).color_range, color_range, ranges.contains(&color_range), "color range", &item)?;
        // Primaries 13..=21 are not declared (FFmpeg skips from SMPTE432 to JEDEC P22).
        let prim_ok = (0..=12).contains(&color_primaries) || color_primaries == 22;
        set_enum(&raw mut (*p).color_primaries, color_primaries, prim_ok, "color primaries", &item)?;
        let trcs = nb(ffi::AVColorTransferCharacteristic::AVCOL_TRC_NB as u32);
        set_enum(&raw mut (*p).color_trc, color_trc, trcs.contains(&color_trc), "transfer characteristic", &item)?;
        let spaces = nb(ffi::AVColorSpace::AVCOL_SPC_NB as u32);
        set_enum(&raw mut (*p).color_space, color_space, spaces.contains(&color_space), "color space", &item)?;
        let locs = nb(ffi::AVChromaLocation::AVCHROMA_LOC_NB as u32);
        let loc_ok = locs.contains(&chroma_location);
        set_enum(&raw mut (*p).chroma_location, chroma_location, loc_ok, "chroma location", &item)?;
        (*p).video_delay = video_delay;
        let native = ch_order == ffi::AVChannelOrder::AV_CHANNEL_ORDER_NATIVE as i32
            || ch_order == ffi::AVChannelOrder::AV_CHANNEL_ORDER_AMBISONIC as i32;
        if native && mask != 0 && ffi::av_channel_layout_from_mask(&raw mut (*p).ch_layout, mask) >= 0 {
            if ch_order == ffi::AVChannelOrder::AV_CHANNEL_ORDER_AMBISONIC as i32 {
                (*p).ch_layout.order = ffi::AVChannelOrder::AV_CHANNEL_ORDER_AMBISONIC;
                (*p).ch_layout.nb_channels = nb_channels;
            }
        } else if nb_channels > 0 {
            // A custom channel map is carried as its channel count (the decoders read the count).
            (*p).ch_layout.order = ffi::AVChannelOrder::AV_CHANNEL_ORDER_UNSPEC;
            (*p).ch_layout.nb_channels = nb_channels;
        }
        (*p).sample_rate = sample_rate;
        (*p).block_align = block_align;
        (*p).frame_size = frame_size;
        (*p).initial_padding = initial_padding;
        (*p).trailing_padding = trailing_padding;
        (*p).seek_preroll = seek_preroll;
        (*p).bit_rate = bit_rate;
    }
    Ok(params)
}

/// The free callback of a view's packet buffers: drops the reference to the memory's keeper that
/// `view_packet` leaked into `opaque`.
unsafe extern "C" fn release_view(opaque: *mut c_void, _data: *mut u8) {
    // SAFETY: `opaque` is the `Box<SharedBytes>` that `view_packet` leaked for this buffer, freed once.
    drop(unsafe { Box::from_raw(opaque.cast::<SharedBytes>()) });
}

/// A packet whose data are `data` (followed by FFmpeg's padding) inside `keeper`'s memory, which it holds.
fn view_packet(data: &[u8], keeper: &SharedBytes, item: &str) -> Result<ff::Packet> {
    let mut pkt = ff::Packet::empty();
    let size = i32::try_from(data.len()).map_err(|_| damaged(item, "a packet over 2 GiB"))?;
    let opaque = Box::into_raw(Box::new(Arc::clone(keeper))).cast::<c_void>();
    // SAFETY: the buffer covers `data` (inside the keeper's memory, which stays alive while the keeper
    // reference in `opaque` does) and is read-only; FFmpeg calls `release_view` once, when its last
    // reference goes, and on failure to create it the leaked reference is taken back here.
    #[allow(clippy::unnecessary_cast)] // the flag's C type differs between FFmpeg majors' bindings
    unsafe {
        let buf = ffi::av_buffer_create(
            data.as_ptr().cast_mut(),
            data.len(),
            Some(release_view),
            opaque,
            ffi::AV_BUFFER_FLAG_READONLY as i32,
        );
        if buf.is_null() {
            drop(Box::from_raw(opaque.cast::<SharedBytes>()));
            return Err(damaged(item, "cannot allocate a packet buffer"));
        }
        let raw = pkt.as_mut_ptr();
        (*raw).buf = buf;
        (*raw).data = (*buf).data;
        (*raw).size = size;
    }
    Ok(pkt)
}

/// Packets from `buf` (bytes that [`serialize`] wrote). With `keeper` (the owner of `buf`'s memory), the
/// packets point into `buf` and keep the keeper alive; without, their data are copied.
pub(crate) fn deserialize(buf: &[u8], keeper: Option<&SharedBytes>) -> Result<MediaPackets> {
    let mut r = Reader { buf, pos: 0, item: "serialized packets".into() };
    if r.take(MAGIC.len()).ok() != Some(&MAGIC[..]) {
        return Err(damaged(&r.item, "not bytes of spdl_rs packets (their __getstate__ makes them)"));
    }
    let header_len = r.len()?;
    let data_start = (r.pos + header_len).next_multiple_of(ALIGN);
    let kind = match r.u8()? {
        0 => MediaType::Audio,
        1 => MediaType::Video,
        2 => MediaType::Image,
        k => return Err(damaged(&r.item, format!("media kind {k}"))),
    };
    let item = String::from_utf8_lossy(r.bytes()?).into_owned();
    r.item = format!("{item} (serialized packets)");
    let window = match r.u8()? {
        0 => None,
        _ => Some((r.f64()?, r.f64()?)),
    };
    let limits = VideoLimits {
        max_packets: r.u64()?,
        max_packet_bytes: r.u64()?,
        max_frames: r.u64()?,
        max_pixels: r.u64()?,
        max_output_bytes: r.u64()?,
        max_bad_packets: r.u32()?,
    };
    let time_base = (r.i32()?, r.i32()?);
    let frame_rate = (r.i32()?, r.i32()?);
    let params = read_params(&mut r, kind)?;
    let codec = codec_from_params(Params(params), kind, time_base, frame_rate);
    let n = r.len()?;
    let mut packets = Vec::new();
    packets.try_reserve_exact(n).map_err(|_| damaged(&r.item, format!("{n} packets")))?;
    for _ in 0..n {
        let (pts, dts, duration, pos, flags) = (r.i64()?, r.i64()?, r.i64()?, r.i64()?, r.i32()?);
        let (off, size) = (r.len()?, r.len()?);
        let start = data_start.checked_add(off);
        let end = start.and_then(|s| s.checked_add(size));
        let padded = end.and_then(|e| e.checked_add(PADDING));
        let (Some(start), Some(end), Some(padded)) = (start, end, padded) else {
            return Err(damaged(&r.item, "a packet offset overflows"));
        };
        if padded > buf.len() {
            return Err(damaged(&r.item, format!("packet data [{start}, {end}) past the {} bytes", buf.len())));
        }
        let data = &buf[start..end];
        let mut pkt = match keeper {
            Some(k) => view_packet(data, k, &r.item)?,
            None => ff::Packet::copy(data),
        };
        let sides = r.u32()?;
        // SAFETY: `pkt` is a valid, owned AVPacket; side data are added through FFmpeg, which allocates
        // `bytes.len()` bytes that are then filled.
        unsafe {
            let raw = pkt.as_mut_ptr();
            (*raw).pts = pts;
            (*raw).dts = dts;
            (*raw).duration = duration;
            (*raw).pos = pos;
            (*raw).flags = flags;
            for _ in 0..sides {
                let ty = r.i32()?;
                let bytes = r.bytes()?;
                if !(0..ffi::AVPacketSideDataType::AV_PKT_DATA_NB as i32).contains(&ty) {
                    return Err(damaged(&r.item, format!("packet side data type {ty} is not one of FFmpeg's")));
                }
                // SAFETY: AVPacketSideDataType is an `int` enum declaring every value in 0..AV_PKT_DATA_NB.
                let ty = std::mem::transmute::<i32, ffi::AVPacketSideDataType>(ty);
                let dst = ffi::av_packet_new_side_data(raw, ty, bytes.len());
                if dst.is_null() {
                    return Err(damaged(&r.item, format!("cannot allocate {} bytes of side data", bytes.len())));
                }
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len());
            }
        }
        packets.push(wrap_packet(pkt));
    }
    Ok(MediaPackets { item, codec, packets, window, limits })
}
