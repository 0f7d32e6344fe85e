//! Builds the C layer over UCP, and the minimal UCP program it is measured against, when
//! the `ucx` feature is on (it needs the system UCX, e.g. Debian's `libucx-dev`); without
//! the feature nothing is compiled or linked. With `pmix` it also builds the C layer
//! over PMIx against the PMIx headers (Debian's `libpmix-dev`); libpmix itself is loaded
//! at run time, so only `libdl` is linked for it.

fn main() {
    println!("cargo:rerun-if-changed=src/ucx/shim.c");
    println!("cargo:rerun-if-changed=src/ucx/minimal.c");
    println!("cargo:rerun-if-changed=src/ucx/pmix.c");
    println!("cargo:rerun-if-env-changed=UCX_HOME");
    println!("cargo:rerun-if-env-changed=PMIX_HOME");
    #[cfg(feature = "ucx")]
    build_shim();
    #[cfg(feature = "pmix")]
    build_pmix_shim();
}

/// The directory holding `pmix.h`: `PMIX_HOME`, what pkg-config says, or where Debian and
/// a default install put it.
#[cfg(feature = "pmix")]
fn pmix_include() -> Option<String> {
    let mut candidates: Vec<String> =
        std::env::var("PMIX_HOME").ok().iter().map(|h| format!("{h}/include")).collect();
    if let Ok(out) =
        std::process::Command::new("pkg-config").args(["--cflags-only-I", "pmix"]).output()
    {
        let flags = String::from_utf8_lossy(&out.stdout).into_owned();
        candidates.extend(
            flags.split_whitespace().filter_map(|f| f.strip_prefix("-I")).map(String::from),
        );
    }
    candidates.extend(
        [
            "/usr/lib/x86_64-linux-gnu/pmix2/include",
            "/usr/lib/aarch64-linux-gnu/pmix2/include",
            "/usr/include",
            "/usr/local/include",
            "/opt/pmix/include",
        ]
        .map(String::from),
    );
    candidates.into_iter().find(|d| std::path::Path::new(d).join("pmix.h").exists())
}

#[cfg(feature = "pmix")]
fn build_pmix_shim() {
    let Some(include) = pmix_include() else {
        panic!(
            "feature `pmix` needs the PMIx headers (pmix.h): install libpmix-dev \
             (apt-get install -y libpmix-dev) or point PMIX_HOME at a PMIx installation"
        );
    };
    cc::Build::new()
        .file("src/ucx/pmix.c")
        .include(include)
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .opt_level(2)
        .compile("hytra_pmix_shim");
    println!("cargo:rustc-link-lib=dl");
}

#[cfg(feature = "ucx")]
fn build_shim() {
    let home = std::env::var("UCX_HOME").ok();
    let mut candidates: Vec<String> = home.iter().map(|h| format!("{h}/include")).collect();
    candidates.extend(["/usr/include".to_string(), "/usr/local/include".to_string()]);
    let Some(include) =
        candidates.into_iter().find(|d| std::path::Path::new(d).join("ucp/api/ucp.h").exists())
    else {
        panic!(
            "feature `ucx` needs the UCX headers (ucp/api/ucp.h): install libucx-dev \
             (apt-get install -y libucx-dev) or point UCX_HOME at a UCX installation"
        );
    };
    cc::Build::new()
        .file("src/ucx/shim.c")
        // The plain-UCP yardstick of `hytra micro --ucp-baseline`; shares nothing with
        // the shim, it only rides in the same library.
        .file("src/ucx/minimal.c")
        .include(include)
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .opt_level(2)
        .compile("hytra_ucx_shim");
    if let Some(home) = home {
        println!("cargo:rustc-link-search=native={home}/lib");
    }
    println!("cargo:rustc-link-lib=ucp");
    println!("cargo:rustc-link-lib=ucs");
}
