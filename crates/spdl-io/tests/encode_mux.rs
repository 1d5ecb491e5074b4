//! Encoding and muxing (feature `ffmpeg`) through the Rust API: frames made from arrays, encoded, muxed into a
//! file, then demuxed and decoded back by `spdl_io::media` and compared within the codec's tolerance; a stream
//! remuxed without re-encoding; and the errors of misuse. Only FFmpeg's own encoders (mpeg4, aac, flac, PCM)
//! are used, so any FFmpeg build runs it; no CLI is needed.
#![cfg(feature = "ffmpeg")]

use std::path::Path;

use spdl_buffer::system_allocator;
use spdl_io::Error;
use spdl_io::media::{
    AudioEncodeConfig, DecodeConfig, DemuxConfig, Demuxer, EncoderChoice, MediaPackets, Muxer, VideoEncodeConfig,
    convert_frames, decode_all, reference_audio_frame, reference_video_frames,
};

const W: usize = 96;
const H: usize = 64;
const N: usize = 10;
const FPS: i32 = 25;
const RATE: u32 = 16_000;

/// Smooth gradients, different in each frame: `[N, H, W, 3]` rgb24.
fn clip() -> Vec<u8> {
    let mut v = Vec::with_capacity(N * H * W * 3);
    for i in 0..N {
        for y in 0..H {
            for x in 0..W {
                v.extend_from_slice(&[(x * 255 / (W - 1)) as u8, (y * 255 / (H - 1)) as u8, (i * 20) as u8]);
            }
        }
    }
    v
}

/// Two sines as interleaved `s16` (`[n, 2]`).
fn tone_s16(n: usize) -> Vec<i16> {
    (0..n)
        .flat_map(|i| {
            let t = i as f64 / f64::from(RATE);
            let l = 0.5 * (2.0 * std::f64::consts::PI * 440.0 * t).sin();
            let r = 0.3 * (2.0 * std::f64::consts::PI * 660.0 * t).sin();
            [(l * 32767.0) as i16, (r * 32767.0) as i16]
        })
        .collect()
}

fn bytes_of(s: &[i16]) -> Vec<u8> {
    s.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn video_config() -> VideoEncodeConfig {
    let mut c = VideoEncodeConfig::new(W as u32, H as u32);
    c.frame_rate = Some((FPS, 1));
    c.pix_fmt = Some("rgb24".into());
    c
}

fn mpeg4() -> EncoderChoice {
    EncoderChoice { encoder: Some("mpeg4".into()), options: Vec::new() }
}

fn write_all(muxer: &mut Muxer, index: usize, packets: Option<MediaPackets>) -> usize {
    packets.map_or(0, |p| {
        muxer.write(index, &p).unwrap();
        p.num_packets()
    })
}

/// Encodes the clip with mpeg4 (rgb24 frames converted to yuv420p) into `path`.
fn encode_clip(path: &Path) -> usize {
    let mut muxer = Muxer::new(path.to_str().unwrap(), None).unwrap();
    let mut enc = muxer.add_video_encode_stream(&video_config(), &mpeg4()).unwrap();
    assert_eq!(enc.encoder_pix_fmt(), "yuv420p");
    assert_eq!(enc.codec().time_base, (1, FPS));
    muxer.open(&[]).unwrap();
    let frames = reference_video_frames(&clip(), &[N, H, W, 3], 1, "rgb24", (FPS, 1), 0).unwrap();
    let mut n = write_all(&mut muxer, 0, enc.encode(&frames).unwrap());
    n += write_all(&mut muxer, 0, enc.flush().unwrap());
    muxer.flush().unwrap();
    muxer.close().unwrap();
    n
}

fn decode_video(path: &Path) -> Vec<u8> {
    let mut d = Demuxer::open(path, &DemuxConfig::default()).unwrap();
    let packets = d.demux_video(None).unwrap();
    let graph = format!(
        "buffer=video_size={W}x{H}:pix_fmt={}:time_base={}/{}:pixel_aspect=1/1,format=pix_fmts=rgb24,buffersink",
        packets.codec.pix_fmt, packets.codec.time_base.0, packets.codec.time_base.1
    );
    let frames = decode_all(&packets, &DecodeConfig::default(), Some(&graph), None).unwrap();
    let buf = convert_frames(&[&frames], false, &system_allocator()).unwrap();
    assert_eq!(buf.shape(), &[N, H, W, 3]);
    buf.as_bytes().to_vec()
}

fn mean_abs(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs()).sum::<f64>() / a.len() as f64
}

#[test]
fn video_round_trip_within_codec_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["mkv", "mp4", "avi"] {
        let path = dir.path().join(format!("v.{ext}"));
        assert_eq!(encode_clip(&path), N);
        let err = mean_abs(&decode_video(&path), &clip());
        assert!(err < 4.0, "{ext}: mean absolute error {err}");
    }
}

#[test]
fn lossless_audio_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let samples = tone_s16(RATE as usize);
    for (ext, frame) in [("wav", 0usize), ("flac", 1152)] {
        let path = dir.path().join(format!("a.{ext}"));
        let mut muxer = Muxer::new(path.to_str().unwrap(), None).unwrap();
        let mut config = AudioEncodeConfig::new(2, RATE);
        config.sample_fmt = Some("s16".into());
        let mut enc = muxer.add_audio_encode_stream(&config, &EncoderChoice::default()).unwrap();
        assert_eq!(enc.frame_size(), frame, "{ext}");
        muxer.open(&[]).unwrap();
        let step = if frame == 0 { samples.len() / 2 } else { frame };
        for (k, chunk) in samples.chunks(step * 2).enumerate() {
            let f = reference_audio_frame(&bytes_of(chunk), &[chunk.len() / 2, 2], 2, "s16", RATE, (k * step) as i64)
                .unwrap();
            write_all(&mut muxer, 0, enc.encode(&f).unwrap());
        }
        write_all(&mut muxer, 0, enc.flush().unwrap());
        muxer.close().unwrap();

        let mut d = Demuxer::open(path.as_path(), &DemuxConfig::default()).unwrap();
        let packets = d.demux_audio(None).unwrap();
        assert_eq!(packets.codec.name, if ext == "wav" { "pcm_s16le" } else { "flac" });
        let frames = decode_all(&packets, &DecodeConfig::default(), None, None).unwrap();
        let buf = convert_frames(&[&frames], false, &system_allocator()).unwrap();
        assert_eq!(buf.shape(), &[RATE as usize, 2], "{ext}");
        assert_eq!(buf.as_slice::<i16>().unwrap(), &samples[..], "{ext}");
    }
}

#[test]
fn remux_copies_packets_without_reencoding() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.mp4");
    encode_clip(&src);
    let dst = dir.path().join("copy.mkv");
    let mut d = Demuxer::open(src.as_path(), &DemuxConfig::default()).unwrap();
    let packets = d.demux_video(None).unwrap();
    let mut muxer = Muxer::new(dst.to_str().unwrap(), None).unwrap();
    assert_eq!(muxer.add_remux_stream(&packets.codec).unwrap(), 0);
    muxer.open(&[]).unwrap();
    muxer.write(0, &packets).unwrap();
    // The same packets again go back in time: the container refuses them with an error (not a panic, not a
    // corrupted file).
    match muxer.write(0, &packets.clone()) {
        Err(Error::Encode { what, .. }) => assert!(what.contains("writing a packet"), "{what}"),
        other => panic!("expected an encode error, got {other:?}"),
    }
    muxer.close().unwrap();
    assert_eq!(decode_video(&dst), decode_video(&src));
}

#[test]
fn misuse_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.mkv");
    let dst = path.to_str().unwrap();
    let unknown = EncoderChoice { encoder: Some("nope".into()), options: Vec::new() };
    let mut muxer = Muxer::new(dst, None).unwrap();
    match muxer.add_video_encode_stream(&video_config(), &unknown) {
        Err(Error::InvalidOptions(m)) => assert!(m.contains("no encoder named \"nope\""), "{m}"),
        other => panic!("{other:?}"),
    }
    let bad_option = EncoderChoice { encoder: Some("mpeg4".into()), options: vec![("bogus".into(), "1".into())] };
    assert!(matches!(muxer.add_video_encode_stream(&video_config(), &bad_option), Err(Error::InvalidOptions(_))));
    assert!(matches!(Muxer::new(&format!("{dst}.nopeext"), None), Err(Error::InvalidOptions(_))));

    let mut enc = muxer.add_video_encode_stream(&video_config(), &mpeg4()).unwrap();
    let frames = reference_video_frames(&clip(), &[N, H, W, 3], 1, "rgb24", (FPS, 1), 0).unwrap();
    let packets = enc.encode(&frames).unwrap().expect("mpeg4 gives packets at once");
    match muxer.write(0, &packets) {
        Err(Error::InvalidOptions(m)) => assert!(m.contains("before write()"), "{m}"),
        other => panic!("{other:?}"),
    }
    muxer.open(&[]).unwrap();
    assert!(matches!(muxer.write(3, &packets), Err(Error::InvalidOptions(m)) if m.contains("out of range")));
    let wrong =
        reference_video_frames(&vec![0; 2 * H * (W + 2) * 3], &[2, H, W + 2, 3], 1, "rgb24", (FPS, 1), 0).unwrap();
    assert!(matches!(enc.encode(&wrong), Err(Error::InvalidOptions(m)) if m.contains("configured for rgb24")));
    let audio = reference_audio_frame(&[0; 4096], &[2, 1024], 2, "s16p", RATE, 0).unwrap();
    assert!(matches!(enc.encode(&audio), Err(Error::InvalidOptions(_))));
    muxer.write(0, &packets).unwrap();
    write_all(&mut muxer, 0, enc.flush().unwrap());
    assert!(enc.flush().unwrap().is_none());
    assert!(matches!(enc.encode(&frames), Err(Error::InvalidOptions(m)) if m.contains("flushed")));
    muxer.close().unwrap();
    muxer.close().unwrap();
    assert!(matches!(muxer.write(0, &packets), Err(Error::InvalidOptions(m)) if m.contains("closed")));

    // An output that does not open: the I/O error, named by the destination.
    let missing = dir.path().join("no/such/dir/x.mkv");
    let mut m = Muxer::new(missing.to_str().unwrap(), None).unwrap();
    m.add_video_encode_stream(&video_config(), &mpeg4()).unwrap();
    match m.open(&[]) {
        Err(e @ Error::Encode { .. }) => {
            let io = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
            assert_eq!(io.map(std::io::Error::kind), Some(std::io::ErrorKind::NotFound), "{e}");
            assert!(e.to_string().contains("x.mkv"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn muxers_and_encoders_move_between_threads() {
    fn send<T: Send>() {}
    send::<Muxer>();
    send::<spdl_io::media::AudioEncoder>();
    send::<spdl_io::media::VideoEncoder>();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.avi");
    let p = path.clone();
    std::thread::spawn(move || encode_clip(&p)).join().unwrap();
    assert!(mean_abs(&decode_video(&path), &clip()) < 4.0);
}

/// Decodes `packets` into one rgb24 buffer (the frames through a filter graph, as `decode_video` does).
fn decode_packets_rgb(packets: &MediaPackets) -> Vec<u8> {
    let graph = format!(
        "buffer=video_size={W}x{H}:pix_fmt={}:time_base={}/{}:pixel_aspect=1/1,format=pix_fmts=rgb24,buffersink",
        packets.codec.pix_fmt, packets.codec.time_base.0, packets.codec.time_base.1
    );
    let frames = decode_all(packets, &DecodeConfig::default(), Some(&graph), None).unwrap();
    convert_frames(&[&frames], false, &system_allocator()).unwrap().as_bytes().to_vec()
}

#[test]
fn serialized_packets_decode_identically_copied_or_viewed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.mkv");
    encode_clip(&path);
    let packets = Demuxer::open(path.as_path(), &DemuxConfig::default()).unwrap().demux_video(None).unwrap();
    let expected = decode_packets_rgb(&packets);
    let bytes = packets.serialize().unwrap();

    let copied = MediaPackets::deserialize(&bytes).unwrap();
    assert_eq!(copied.num_packets(), packets.num_packets());
    assert_eq!(copied.codec.name, packets.codec.name);
    assert_eq!(copied.timestamps(true), packets.timestamps(true));
    assert_eq!(decode_packets_rgb(&copied), expected);

    let shared: std::sync::Arc<Vec<u8>> = std::sync::Arc::new(bytes.clone());
    let viewed = MediaPackets::deserialize_view(shared.clone()).unwrap();
    assert!(std::sync::Arc::strong_count(&shared) > 1, "the view holds its bytes");
    assert_eq!(decode_packets_rgb(&viewed), expected);
    drop(viewed);
    assert_eq!(std::sync::Arc::strong_count(&shared), 1, "the view released its bytes");

    // Truncated or foreign bytes: an error naming the cause, never a read past the end.
    for bad in [&bytes[..0], &bytes[..20], &bytes[..bytes.len() / 2], b"SPDLPKT1 but nothing else".as_slice()] {
        let err = MediaPackets::deserialize(bad).unwrap_err();
        assert!(err.to_string().contains("serialized packets"), "{err}");
    }
}
