//! A clip plan decoded with libavcodec: each run of packets once, from its keyframe, in decode order; the
//! decoder drained and flushed between runs. Packets of frames that no clip keeps go in with `skip_frame` at
//! "non-reference" (the decoder drops them where nothing references them); kept frames are converted once
//! each, straight into their first slot, and copied into the others.

use ffmpeg_next as ff;

use super::avio::ff_error;
use super::media::{ff_packet, params_of};
use super::video::{Converter, open_decoder};
use crate::types::clips::{ClipOptions, ClipPlan, ClipStats, FrameMatch, KeptFrame};
use crate::types::media::Packets;
use crate::{Error, Result};

/// Where decoded frames go: each kept frame into its slots.
struct ClipSink<'a> {
    item: &'a str,
    plan: &'a ClipPlan,
    dst: &'a mut [u8],
    frame_bytes: usize,
    /// Slots of each kept frame (CSR: `slot_of[first[k]..first[k + 1]]`).
    first: Vec<usize>,
    slot_of: Vec<usize>,
    filled: Vec<bool>,
    remaining: usize,
    max_pixels: u64,
    max_frames: u64,
    ordinal: i64,
    stats: ClipStats,
    unknown: u64,
}

impl<'a> ClipSink<'a> {
    fn new(item: &'a str, plan: &'a ClipPlan, opts: &ClipOptions, dst: &'a mut [u8], frame_bytes: usize) -> Self {
        let k = plan.kept.len();
        let mut first = vec![0usize; k + 1];
        for &s in &plan.slots {
            first[s as usize + 1] += 1;
        }
        for i in 0..k {
            first[i + 1] += first[i];
        }
        let mut next = first.clone();
        let mut slot_of = vec![0usize; plan.slots.len()];
        for (slot, &s) in plan.slots.iter().enumerate() {
            slot_of[next[s as usize]] = slot;
            next[s as usize] += 1;
        }
        ClipSink {
            item,
            plan,
            dst,
            frame_bytes,
            first,
            slot_of,
            filled: vec![false; k],
            remaining: k,
            max_pixels: opts.limits.max_pixels,
            max_frames: opts.limits.max_frames,
            ordinal: 0,
            stats: ClipStats {
                frames_in_video: plan.frames_in_video,
                frames_kept: k as u64,
                runs: plan.runs.len() as u64,
                ..Default::default()
            },
            unknown: 0,
        }
    }

    /// The kept frame `frame` is, if any: by timestamp (the first unfilled of that timestamp), or by
    /// output order.
    fn kept_index(&mut self, frame: &ff::frame::Video) -> Option<usize> {
        let kept: &[KeptFrame] = &self.plan.kept;
        match self.plan.matching {
            FrameMatch::Pts => {
                let ts = frame.pts().or(frame.timestamp())?;
                let lo = kept.partition_point(|k| k.ts < ts);
                let hi = lo + kept[lo..].partition_point(|k| k.ts == ts);
                if lo == hi {
                    if self.plan.known_ts.binary_search(&ts).is_err() {
                        self.unknown += 1;
                    }
                    return None;
                }
                (lo..hi).find(|&i| !self.filled[i])
            }
            FrameMatch::Ordinal => {
                let ord = self.ordinal;
                self.ordinal += 1;
                let i = kept.partition_point(|k| k.ts < ord);
                (kept.get(i).is_some_and(|k| k.ts == ord) && !self.filled[i]).then_some(i)
            }
        }
    }

    fn on_frame(&mut self, frame: &ff::frame::Video, conv: &mut Converter) -> Result<()> {
        self.stats.frames_decoded += 1;
        if self.stats.frames_decoded > self.max_frames {
            return Err(Error::LimitExceeded {
                item: self.item.to_owned(),
                what: "decoded frames".into(),
                value: self.stats.frames_decoded,
                limit: self.max_frames,
            });
        }
        let Some(k) = self.kept_index(frame) else { return Ok(()) };
        let pixels = u64::from(frame.width()) * u64::from(frame.height());
        if pixels == 0 {
            return Ok(());
        }
        if pixels > self.max_pixels {
            return Err(Error::LimitExceeded {
                item: self.item.to_owned(),
                what: "pixels per frame".into(),
                value: pixels,
                limit: self.max_pixels,
            });
        }
        let fb = self.frame_bytes;
        let slots = &self.slot_of[self.first[k]..self.first[k + 1]];
        let Some((&s0, rest)) = slots.split_first() else { return Ok(()) };
        let dst = self
            .dst
            .get_mut(s0 * fb..(s0 + 1) * fb)
            .ok_or_else(|| Error::InvalidOptions(format!("{}: clip slot {s0} is outside the output", self.item)))?;
        conv.convert(frame, dst, self.item)?;
        self.stats.frames_converted += 1;
        for &s in rest {
            self.dst.copy_within(s0 * fb..(s0 + 1) * fb, s * fb);
        }
        self.filled[k] = true;
        self.remaining -= 1;
        Ok(())
    }
}

/// Decodes `plan` into `dst` (`clips * frames` slots of the output frame size, clip-major).
pub(crate) fn decode_clips(packets: Packets, plan: &ClipPlan, opts: &ClipOptions, dst: &mut [u8]) -> Result<ClipStats> {
    let (w, h) = opts.output_size(&packets)?;
    let item = packets.item.clone();
    let codec = packets.codec.name.clone();
    let frame_bytes = w as usize * h as usize * opts.pixel_format.channels();
    if plan.keep_packet.len() != packets.packets.len() {
        return Err(Error::InvalidOptions(format!("{item}: the clip plan was made from other packets")));
    }
    let params = params_of(&packets.codec)?.0.clone();
    let time_base = ff::Rational::new(packets.codec.time_base.0, packets.codec.time_base.1);
    let mut decoder = open_decoder(params, time_base, opts.threads, &item, &codec)?;
    let mut conv = Converter::new(opts.pixel_format, w, h, opts.filter);
    let mut sink = ClipSink::new(&item, plan, opts, dst, frame_bytes);
    let skip = opts.skip_unused && plan.matching == FrameMatch::Pts;
    let max_bad = opts.limits.max_bad_packets;
    let mut frame = ff::frame::Video::empty();
    let mut skipping = false;
    'runs: for (r, &(start, end)) in plan.runs.iter().enumerate() {
        if r > 0 {
            decoder.flush();
        }
        let mut bad = 0u32;
        for q in start..=end.min(packets.packets.len().saturating_sub(1)) {
            let packet = ff_packet(&packets.packets[q], &item)?;
            let want_skip = skip && !plan.keep_packet[q];
            if want_skip != skipping {
                let level = if want_skip {
                    ff::ffi::AVDiscard::AVDISCARD_NONREF
                } else {
                    ff::ffi::AVDiscard::AVDISCARD_DEFAULT
                };
                // SAFETY: `skip_frame` is a field the user sets at any time between calls; the decoder
                // context is open and owned here (frame threads copy it when a packet is submitted).
                unsafe { (*decoder.as_mut_ptr()).skip_frame = level };
                skipping = want_skip;
            }
            sink.stats.packets_sent += 1;
            sink.stats.packets_skippable += u64::from(want_skip);
            if let Err(e) = decoder.send_packet(packet) {
                // A damaged packet: skipped (bounded), as FFmpeg's CLI does; a kept frame it held is then
                // reported missing below.
                bad += 1;
                if bad > max_bad {
                    return Err(ff_error(&item, &codec, e));
                }
                continue;
            }
            bad = 0;
            while decoder.receive_frame(&mut frame).is_ok() {
                sink.on_frame(&frame, &mut conv)?;
            }
            if sink.remaining == 0 {
                break 'runs;
            }
        }
        // The frames the decoder still holds (reordering delay) belong to this run.
        if decoder.send_eof().is_ok() {
            while decoder.receive_frame(&mut frame).is_ok() {
                sink.on_frame(&frame, &mut conv)?;
            }
        }
        if sink.remaining == 0 {
            break;
        }
    }
    if sink.remaining > 0 {
        let missing = sink.filled.iter().position(|f| !f).map(|k| plan.kept[k]);
        let unknown = sink.unknown;
        let total = plan.kept.len();
        let remaining = sink.remaining;
        let first = missing.map_or(String::new(), |k| format!(" (the first is frame {} at {:.3} s)", k.index, k.pts_s));
        let why = if unknown > 0 {
            format!("; {unknown} decoded frames carry presentation timestamps that no packet has")
        } else {
            String::new()
        };
        return Err(Error::Decode {
            item,
            format: codec,
            cause: format!("{remaining} of the {total} frames the clips keep did not decode{first}{why}").into(),
        });
    }
    Ok(sink.stats)
}
