//! `spdl probe FILE`.

use std::path::Path;

use anyhow::{Context, Result};

/// Prints what the file holds.
pub fn run(file: &Path, json: bool) -> Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let info = spdl_io::image::image_info(&bytes, &file.display().to_string()).with_context(|| {
        format!("{}: not an image this build can read (audio/video probing comes with issue 4)", file.display())
    })?;
    if json {
        println!(
            "{}",
            serde_json::json!({"path": file.display().to_string(), "kind": "image", "format": format!("{:?}", info.format), "width": info.width, "height": info.height, "size_bytes": bytes.len()})
        );
    } else {
        println!("{}: image {:?} {}x{}, {} bytes", file.display(), info.format, info.width, info.height, bytes.len());
    }
    Ok(())
}
