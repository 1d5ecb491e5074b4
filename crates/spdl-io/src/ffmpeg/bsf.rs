//! Bitstream filters (SPDL's `BSF`/`apply_bsf`): FFmpeg's `h264_mp4toannexb` and the like, applied to
//! owned packets, keeping their window.

use std::ffi::{CString, c_int};
use std::ptr;

use ff::ffi;
use ff::packet::Mut as _;
use ffmpeg_next as ff;

use super::avio::ff_error;
use super::media::{Params, codec_from_params, ff_packet, params_of, wrap_packet};
use crate::types::media::{Codec, MediaPackets, Packet};
use crate::types::video::VideoLimits;
use crate::{Error, Result};

/// A bitstream filter chain (crate::media::Bsf's backend).
pub(crate) struct FfBsf {
    ctx: *mut ffi::AVBSFContext,
    desc: String,
    codec: Codec,
    limits: VideoLimits,
    flushed: bool,
}

// SAFETY: the context is owned by this value alone and used only through `&mut self`.
unsafe impl Send for FfBsf {}

impl Drop for FfBsf {
    fn drop(&mut self) {
        // SAFETY: `ctx` was allocated by av_bsf_list_parse_str (or is null); freed once.
        unsafe { ffi::av_bsf_free(&mut self.ctx) };
    }
}

fn bsf_error(desc: &str, code: c_int) -> Error {
    Error::InvalidOptions(format!("bitstream filter {desc:?}: {}", ff::Error::from(code)))
}

impl FfBsf {
    /// The description it was made from.
    pub(crate) fn desc(&self) -> &str {
        &self.desc
    }

    /// The filter chain `desc` for packets of `codec`.
    ///
    /// Errors: [`Error::InvalidOptions`] for an unknown filter or one that does not take this codec.
    pub(crate) fn new(codec: &Codec, desc: &str) -> Result<FfBsf> {
        super::avio::init();
        let c = CString::new(desc)
            .map_err(|_| Error::InvalidOptions(format!("bitstream filter {desc:?}: contains a NUL character")))?;
        let mut ctx: *mut ffi::AVBSFContext = ptr::null_mut();
        // SAFETY: `c` is NUL-terminated; on success `ctx` is a new context owned by the returned value.
        let r = unsafe { ffi::av_bsf_list_parse_str(c.as_ptr(), &mut ctx) };
        if r < 0 || ctx.is_null() {
            return Err(bsf_error(desc, r));
        }
        let params = params_of(codec)?;
        let mut bsf =
            FfBsf { ctx, desc: desc.to_owned(), codec: codec.clone(), limits: VideoLimits::default(), flushed: false };
        // SAFETY: `ctx` is a valid, not yet initialised context; `par_in` was allocated with it.
        let r = unsafe {
            let r = ffi::avcodec_parameters_copy((*ctx).par_in, params.0.as_ptr());
            if r < 0 {
                r
            } else {
                (*ctx).time_base_in = ffi::AVRational { num: codec.time_base.0, den: codec.time_base.1 };
                ffi::av_bsf_init(ctx)
            }
        };
        if r < 0 {
            return Err(bsf_error(desc, r));
        }
        // SAFETY: an initialised context has valid output parameters and time base.
        let out = unsafe {
            let mut p = ff::codec::Parameters::new();
            let r = ffi::avcodec_parameters_copy(p.as_mut_ptr(), (*ctx).par_out);
            if r < 0 {
                return Err(bsf_error(desc, r));
            }
            let tb = (*ctx).time_base_out;
            codec_from_params(Params(p), codec.kind, (tb.num, tb.den), codec.frame_rate)
        };
        bsf.codec = out;
        Ok(bsf)
    }

    /// The codec of the filtered packets.
    pub(crate) fn output_codec(&self) -> &Codec {
        &self.codec
    }

    fn receive(&mut self, item: &str, out: &mut Vec<Packet>, bytes: &mut u64) -> Result<()> {
        loop {
            let mut p = ff::Packet::empty();
            // SAFETY: `ctx` is initialised; `p` an owned empty packet that receives a reference.
            let r = unsafe { ffi::av_bsf_receive_packet(self.ctx, p.as_mut_ptr()) };
            if r == ffi::AVERROR(ffi::EAGAIN) || r == ffi::AVERROR_EOF {
                return Ok(());
            }
            if r < 0 {
                return Err(ff_error(item, &format!("bitstream filter {}", self.desc), ff::Error::from(r)));
            }
            *bytes += p.size() as u64;
            if out.len() as u64 >= self.limits.max_packets || *bytes > self.limits.max_packet_bytes {
                return Err(Error::LimitExceeded {
                    item: item.to_owned(),
                    what: "filtered packet bytes".into(),
                    value: *bytes,
                    limit: self.limits.max_packet_bytes,
                });
            }
            out.push(wrap_packet(p));
        }
    }

    /// Filters `packets` (ending the stream when `flush`): the packets ready, or `None`.
    pub(crate) fn filter(&mut self, packets: &MediaPackets, flush: bool) -> Result<Option<MediaPackets>> {
        if self.flushed {
            return Err(Error::InvalidOptions(format!("bitstream filter {:?} was flushed; make a new one", self.desc)));
        }
        self.limits = packets.limits;
        let (mut out, mut bytes) = (Vec::new(), 0u64);
        for p in &packets.packets {
            let mut copy = ff_packet(p, &packets.item)?.clone();
            // SAFETY: `ctx` is initialised; `copy` is an owned packet whose reference FFmpeg takes over.
            let r = unsafe { ffi::av_bsf_send_packet(self.ctx, copy.as_mut_ptr()) };
            if r < 0 {
                return Err(ff_error(&packets.item, &format!("bitstream filter {}", self.desc), ff::Error::from(r)));
            }
            self.receive(&packets.item, &mut out, &mut bytes)?;
        }
        if flush {
            self.flushed = true;
            // SAFETY: a null packet signals the end of the stream.
            let r = unsafe { ffi::av_bsf_send_packet(self.ctx, ptr::null_mut()) };
            if r >= 0 {
                self.receive(&packets.item, &mut out, &mut bytes)?;
            }
        }
        Ok((!out.is_empty()).then(|| MediaPackets {
            item: packets.item.clone(),
            codec: self.codec.clone(),
            packets: out,
            window: packets.window,
            limits: packets.limits,
        }))
    }

    /// Ends the stream: the packets the filter still held, or `None`.
    pub(crate) fn flush(&mut self, item: &str) -> Result<Option<MediaPackets>> {
        if self.flushed {
            return Ok(None);
        }
        self.flushed = true;
        let (mut out, mut bytes) = (Vec::new(), 0u64);
        // SAFETY: a null packet signals the end of the stream.
        let r = unsafe { ffi::av_bsf_send_packet(self.ctx, ptr::null_mut()) };
        if r >= 0 {
            self.receive(item, &mut out, &mut bytes)?;
        }
        Ok((!out.is_empty()).then(|| MediaPackets {
            item: item.to_owned(),
            codec: self.codec.clone(),
            packets: out,
            window: None,
            limits: self.limits,
        }))
    }
}
