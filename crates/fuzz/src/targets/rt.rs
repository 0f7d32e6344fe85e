//! The runtime's frame format: a datagram holding several frames (requests, replies,
//! one-way frames, errors), parsed as a worker dispatches it.

use hytra_rt::constants::{FRAME_HEADER, RPC_PAYLOAD_MAX};
use hytra_rt::{frames, Frame, FrameKind, RpcType};

use crate::Target;

/// The targets of this file.
pub const TARGETS: &[Target] = &[Target {
    name: "rpc-frames",
    about: "a received datagram's frames (hytra_rt::frames, Header::decode)",
    seeds,
    run,
}];

fn seeds() -> Vec<Vec<u8>> {
    let req =
        Frame { kind: FrameKind::Request, ty: RpcType(1), call_id: 1 << 32 | 3, payload: &[] };
    let frames_of = |fs: &[Frame<'_>]| {
        let mut d = Vec::new();
        for f in fs {
            f.encode(&mut d);
        }
        d
    };
    let body: Vec<u8> = (0..32).collect();
    vec![
        frames_of(&[Frame { payload: &body, ..req }]),
        frames_of(&[
            Frame { payload: &body[..24], ..req },
            Frame { kind: FrameKind::Reply, ty: RpcType(6), call_id: 7 << 32 | 1, payload: &body },
            Frame { kind: FrameKind::OneWay, ty: RpcType(7), call_id: 0, payload: &body[..16] },
            Frame { kind: FrameKind::Error, ty: RpcType(2), call_id: 5, payload: &[1] },
        ]),
        frames_of(&[req, Frame { ty: RpcType(48), call_id: 9, ..req }]),
    ]
}

fn run(input: &[u8]) {
    let mut consumed = 0;
    let mut again = Vec::new();
    for f in frames(input) {
        let Ok(f) = f else { break };
        assert!(
            f.kind == FrameKind::OneWay || f.call_id != 0,
            "a call frame without a call id reaches the dispatcher"
        );
        assert_eq!(&input[consumed + FRAME_HEADER..][..f.payload.len()], f.payload);
        consumed += FRAME_HEADER + f.payload.len();
        // Only frames a worker could have sent re-encode (a received one may be longer).
        if f.payload.len() <= RPC_PAYLOAD_MAX {
            again.clear();
            f.encode(&mut again);
            let back: Vec<_> = frames(&again).collect();
            assert_eq!(back, vec![Ok(f)], "a frame decodes to itself");
        }
    }
    assert!(consumed <= input.len());
}
