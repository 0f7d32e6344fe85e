//! Builds the C layer over UCP, and the minimal UCP program it is measured against, when
//! the `ucx` feature is on (it needs the system UCX, e.g. Debian's `libucx-dev`); without
//! the feature nothing is compiled or linked.

fn main() {
    println!("cargo:rerun-if-changed=src/ucx/shim.c");
    println!("cargo:rerun-if-changed=src/ucx/minimal.c");
    println!("cargo:rerun-if-env-changed=UCX_HOME");
    #[cfg(feature = "ucx")]
    build_shim();
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
