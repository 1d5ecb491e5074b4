//! The encoder delay of an MP4/M4A audio track, read from its edit list (`moov/trak/edts/elst`).
//!
//! AAC encoders put priming samples (1024 for AAC-LC, 2112 for some encoders) before the first real
//! sample, and an MP4 muxer records their count as the edit list's `media_time`. FFmpeg (and so
//! torchaudio and Meta's SPDL) skips them; symphonia's MP4 reader does not, so spdl-io reads the edit list
//! itself and drops that many frames from the start of the track. The end padding is kept, as FFmpeg
//! keeps it.

use std::fs::File;

use crate::input::MediaInput;

/// Top-level boxes looked at before giving up on finding `moov`.
const MAX_TOP_LEVEL_BOXES: usize = 4096;
/// A larger `moov` is not read (it holds the sample tables of a long file; the edit list is not worth it).
const MAX_MOOV_BYTES: u64 = 64 << 20;
/// The largest delay believed: a few AAC frames. More is a damaged or unusual edit list, ignored.
const MAX_DELAY_FRAMES: u64 = 1 << 16;

/// One box: its type and its payload (after the header).
struct MpBox<'a> {
    kind: [u8; 4],
    body: &'a [u8],
}

/// The boxes packed in `data`, stopping at the first malformed header.
fn boxes(mut data: &[u8]) -> impl Iterator<Item = MpBox<'_>> {
    std::iter::from_fn(move || {
        let (size, kind, header) = parse_header(data)?;
        let size = if size == 0 { data.len() as u64 } else { size };
        let end = usize::try_from(size).ok().filter(|&e| e >= header && e <= data.len())?;
        let b = MpBox { kind, body: &data[header..end] };
        data = &data[end..];
        Some(b)
    })
}

/// A box header: (size including the header, or 0 for "to the end"; type; header length).
fn parse_header(data: &[u8]) -> Option<(u64, [u8; 4], usize)> {
    let size = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?);
    let kind: [u8; 4] = data.get(4..8)?.try_into().ok()?;
    match size {
        1 => Some((u64::from_be_bytes(data.get(8..16)?.try_into().ok()?), kind, 16)),
        0 => Some((0, kind, 8)),
        s if s >= 8 => Some((u64::from(s), kind, 8)),
        _ => None,
    }
}

fn child<'a>(data: &'a [u8], kind: &[u8; 4]) -> Option<&'a [u8]> {
    boxes(data).find(|b| &b.kind == kind).map(|b| b.body)
}

fn be_u32(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn be_u64(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

/// The `moov` box of `input`, read with positioned reads (it may follow the media data).
fn read_moov(input: &MediaInput<'_>) -> Option<Vec<u8>> {
    let len = input.len().ok()?;
    let mut file: Option<File> = match input {
        MediaInput::Path(p) => Some(MediaInput::open_file(p).ok()?),
        MediaInput::Bytes { .. } => None,
    };
    let mut offset = 0u64;
    for _ in 0..MAX_TOP_LEVEL_BOXES {
        if offset.saturating_add(8) > len {
            return None;
        }
        let head = input.read_at(file.as_mut(), offset, 16).ok()?;
        let (size, kind, header) = parse_header(&head)?;
        let size = if size == 0 { len - offset } else { size };
        if size < header as u64 {
            return None;
        }
        if &kind == b"moov" {
            let body = size - header as u64;
            if body > MAX_MOOV_BYTES || offset.saturating_add(size) > len {
                return None;
            }
            let data = input.read_at(file.as_mut(), offset + header as u64, usize::try_from(body).ok()?).ok()?;
            return Some(data.into_owned());
        }
        offset = offset.checked_add(size)?;
    }
    None
}

/// The first entry of an `elst` payload that maps media (`media_time` >= 0), as its media time.
fn first_media_time(elst: &[u8]) -> Option<u64> {
    let version = *elst.first()?;
    let count = be_u32(elst, 4)? as usize;
    let (entry, at) = match version {
        0 => (12, 8),
        1 => (20, 8),
        _ => return None,
    };
    (0..count.min(64)).find_map(|i| {
        let base = at + i * entry;
        let media_time = match version {
            0 => i64::from(be_u32(elst, base + 4)? as i32),
            _ => be_u64(elst, base + 8)? as i64,
        };
        u64::try_from(media_time).ok()
    })
}

/// The `mdhd` time scale (units per second of the track's media time).
fn media_timescale(mdhd: &[u8]) -> Option<u32> {
    let at = match *mdhd.first()? {
        0 => 12,
        1 => 20,
        _ => return None,
    };
    be_u32(mdhd, at).filter(|&t| t > 0)
}

/// Frames at `rate` to drop from the start of the first audio track of an MP4/M4A input: its edit list's
/// `media_time`. `None` when the input has no `moov`, no audio track, no edit list, or one that does not
/// parse or is implausible (then nothing is dropped).
pub(crate) fn priming_frames(input: &MediaInput<'_>, rate: u32) -> Option<u64> {
    let moov = read_moov(input)?;
    let trak = boxes(&moov).filter(|b| &b.kind == b"trak").map(|b| b.body).find(|trak| {
        child(trak, b"mdia").and_then(|m| child(m, b"hdlr")).and_then(|h| h.get(8..12)) == Some(b"soun")
    })?;
    let media_time = first_media_time(child(child(trak, b"edts")?, b"elst")?)?;
    let timescale = media_timescale(child(child(trak, b"mdia")?, b"mdhd")?)?;
    let frames = u128::from(media_time) * u128::from(rate) / u128::from(timescale);
    u64::try_from(frames).ok().filter(|&f| f > 0 && f <= MAX_DELAY_FRAMES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mp4_box(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut v = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        v.extend_from_slice(kind);
        v.extend_from_slice(body);
        v
    }

    /// A minimal file: ftyp, mdat, then a moov with a video trak (edit 0) and an audio trak.
    fn file(audio_media_time: i32, timescale: u32) -> Vec<u8> {
        let hdlr = |h: &[u8; 4]| mp4_box(b"hdlr", &[&[0u8; 8][..], h, &[0u8; 12]].concat());
        let mdhd = mp4_box(b"mdhd", &[&[0u8; 12][..], &timescale.to_be_bytes(), &[0u8; 8]].concat());
        let elst = |t: i32| {
            // Two entries: an empty edit (media_time -1), then the real one.
            let mut b = vec![0u8, 0, 0, 0];
            b.extend_from_slice(&2u32.to_be_bytes());
            b.extend_from_slice(&[&100u32.to_be_bytes()[..], &(-1i32).to_be_bytes(), &[0, 1, 0, 0]].concat());
            b.extend_from_slice(&[&5000u32.to_be_bytes()[..], &t.to_be_bytes(), &[0, 1, 0, 0]].concat());
            mp4_box(b"elst", &b)
        };
        let trak = |h: &[u8; 4], t: i32| {
            let mdia = mp4_box(b"mdia", &[mdhd.clone(), hdlr(h)].concat());
            mp4_box(b"trak", &[mp4_box(b"edts", &elst(t)), mdia].concat())
        };
        let moov = mp4_box(b"moov", &[trak(b"vide", 0), trak(b"soun", audio_media_time)].concat());
        [mp4_box(b"ftyp", b"M4A \0\0\0\0"), mp4_box(b"mdat", &[7u8; 1000]), moov].concat()
    }

    #[test]
    fn reads_the_audio_tracks_media_time_at_the_output_rate() {
        let data = file(1024, 44_100);
        assert_eq!(priming_frames(&MediaInput::bytes(&data, "a.m4a"), 44_100), Some(1024));
        assert_eq!(priming_frames(&MediaInput::bytes(&data, "a.m4a"), 22_050), Some(512));
        let data = file(2112, 48_000);
        assert_eq!(priming_frames(&MediaInput::bytes(&data, "a.m4a"), 48_000), Some(2112));
    }

    #[test]
    fn no_or_implausible_edit_list_drops_nothing() {
        assert_eq!(priming_frames(&MediaInput::bytes(&file(0, 44_100), "a.m4a"), 44_100), None);
        assert_eq!(priming_frames(&MediaInput::bytes(&file(1 << 30, 44_100), "a.m4a"), 44_100), None);
        let data = file(1024, 44_100);
        for cut in [0, 7, 20, 1030, data.len() - 1] {
            assert_eq!(priming_frames(&MediaInput::bytes(&data[..cut], "cut.m4a"), 44_100), None, "cut at {cut}");
        }
        assert_eq!(priming_frames(&MediaInput::bytes(b"RIFF....WAVEfmt ", "a.wav"), 44_100), None);
        // A 64-bit size that would overflow an offset.
        let huge = [&1u32.to_be_bytes()[..], b"moov", &u64::MAX.to_be_bytes(), &[0u8; 16]].concat();
        assert_eq!(priming_frames(&MediaInput::bytes(&huge, "huge.m4a"), 44_100), None);
        let huge = [&1u32.to_be_bytes()[..], b"free", &(u64::MAX - 4).to_be_bytes(), &[0u8; 16]].concat();
        assert_eq!(priming_frames(&MediaInput::bytes(&huge, "huge.m4a"), 44_100), None);
    }
}
