//! The I/O service's messages (`READ`, `DONE`) and I/O trace files.

use hytra_fabric::Rkey;
use hytra_io::trace::{self, TraceOp};
use hytra_io::wire::{decode_done, encode_done, ReadReq, READ_REQ_LEN};
use hytra_io::{FileId, ReadStatus};

use crate::Target;

/// The targets of this file.
pub const TARGETS: &[Target] = &[
    Target {
        name: "io-read-req",
        about: "the I/O service's READ request (hytra_io::wire::ReadReq::decode)",
        seeds: read_seeds,
        run: read_run,
    },
    Target {
        name: "io-done",
        about: "the I/O service's DONE message (hytra_io::wire::decode_done)",
        seeds: done_seeds,
        run: done_run,
    },
    Target {
        name: "io-trace",
        about: "an I/O trace file (hytra_io::trace::parse)",
        seeds: trace_seeds,
        run: trace_run,
    },
];

fn read_seeds() -> Vec<Vec<u8>> {
    let r = ReadReq {
        req_id: 7,
        file: FileId(1),
        offset: 1 << 30,
        len: 16384,
        dst_rkey: Rkey(3),
        dst_offset: 4096,
    };
    let mut b = Vec::new();
    r.encode(&mut b);
    vec![b]
}

fn read_run(input: &[u8]) {
    if let Some(r) = ReadReq::decode(input) {
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(b.len(), READ_REQ_LEN);
        assert_eq!(b, input, "a request re-encodes to its bytes");
    }
}

fn done_seeds() -> Vec<Vec<u8>> {
    let mut a = Vec::new();
    encode_done(&mut a, 9, ReadStatus::Ok, 0, &[]);
    let mut b = Vec::new();
    encode_done(&mut b, u64::MAX, ReadStatus::Ok, 24, &[5; 24]);
    let mut c = Vec::new();
    encode_done(&mut c, 3, ReadStatus::PastEnd, 512, &[]);
    vec![a, b, c]
}

fn done_run(input: &[u8]) {
    if let Some((id, status, len, data)) = decode_done(input) {
        let mut b = Vec::new();
        encode_done(&mut b, id, status, len, data);
        assert_eq!(b, input, "a DONE re-encodes to its bytes");
    }
}

fn trace_seeds() -> Vec<Vec<u8>> {
    let q3 = trace::tpch_q3(4 << 20, 4096, 40, 1);
    let small = vec![TraceOp { offset: 0, len: 512 }, TraceOp { offset: 1 << 33, len: 16384 }];
    vec![
        trace::format(&q3).into_bytes(),
        trace::format(&small).into_bytes(),
        b"# a comment\n\n 5 , 7 # trailing\n4096,4096\n".to_vec(),
    ]
}

fn trace_run(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    if let Ok(ops) = trace::parse(&text) {
        assert!(ops.iter().all(|o| o.len > 0), "a read of no bytes");
        assert_eq!(trace::parse(&trace::format(&ops)), Ok(ops), "a trace re-reads as itself");
    }
}
