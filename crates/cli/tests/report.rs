//! The `hytra reproduce` report as a browser draws it: headless Chromium renders a quick
//! report to a screenshot, which must have the window's size and show the page's text
//! and its charts' colours, not a blank or broken page.
//!
//! Needs Chromium (`apt-get install -y chromium`). Without it the test says so and
//! passes, unless `HYTRA_REQUIRE_CHROMIUM` is set (CI sets it, so there it cannot skip).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The browser's window, and so the screenshot's size.
const WIDTH: u32 = 1200;
const HEIGHT: u32 = 1600;
/// Longest a render may take before the browser is killed and the test fails.
const RENDER_TIMEOUT: Duration = Duration::from_secs(90);

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// A directory of this test's own, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the browser headless on `page`, writing `shot`; kills it past the timeout.
fn screenshot(browser: &Path, page: &Path, shot: &Path, profile: &Path) {
    // The flags keep a headless browser off the network (this machine's is closed) and
    // out of the user's profile; --no-sandbox because tests may run as root.
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            // Containers often give /dev/shm only a few MiB.
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={WIDTH},{HEIGHT}"))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for chromium") {
            assert!(status.success(), "chromium failed: {status}");
            return;
        }
        if started.elapsed() > RENDER_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not render the report within {RENDER_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_report_renders_in_a_browser_with_its_text_and_charts() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("HYTRA_REQUIRE_CHROMIUM").is_none(),
            "HYTRA_REQUIRE_CHROMIUM is set but no chromium is on PATH"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install -y chromium)");
        return;
    };
    let dir = TempDir(std::env::temp_dir().join(format!("hytra-report-{}", std::process::id())));
    let out = dir.0.join("report");
    let run = Command::new(env!("CARGO_BIN_EXE_hytra"))
        .args(["reproduce", "--quick", "--only", "fig11,redn-get", "--out"])
        .arg(&out)
        .output()
        .expect("hytra runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let shot = dir.0.join("shot.png");
    screenshot(&browser, &out.join("index.html"), &shot, &dir.0.join("profile"));

    let decoder = png::Decoder::new(std::fs::File::open(&shot).expect("a screenshot"));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a frame");
    assert_eq!((info.width, info.height), (WIDTH, HEIGHT), "the window's size");
    let channels = info.color_type.samples();
    assert!(channels >= 3 && info.bit_depth == png::BitDepth::Eight, "{info:?}");
    let pixels: Vec<[u8; 3]> =
        buf[..info.buffer_size()].chunks(channels).map(|p| [p[0], p[1], p[2]]).collect();
    // Text and axes: dark pixels, a few percent of the page.
    let dark = pixels.iter().filter(|p| p.iter().all(|&c| c < 80)).count();
    assert!(dark * 100 > pixels.len(), "{dark} dark pixels of {}: a blank page", pixels.len());
    // The charts' lines: the second series' orange (#d95f02) and the fourth's purple
    // (#7570b3), give or take antialiasing. (Not the first's blue: the page's paper boxes
    // have a border of it.)
    let near = |p: &[u8; 3], c: [u8; 3]| p.iter().zip(c).all(|(&a, b)| a.abs_diff(b) < 24);
    for (name, c) in [("orange", [0xd9, 0x5f, 0x02]), ("purple", [0x75, 0x70, 0xb3])] {
        let n = pixels.iter().filter(|p| near(p, c)).count();
        assert!(n > 200, "{n} pixels of the charts' {name}: no charts drawn");
    }
}
