//! I/O traces: a text file of `offset,length` lines (`#` starts a comment), and a
//! generator of a TPC-H Q3-like trace.

use hytra_fabric::rng::Rng;
use thiserror::Error;

/// One read of a trace.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct TraceOp {
    /// Byte offset.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
}

/// A line of a trace that is not `offset,length`.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("trace line {line}: {reason}")]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

/// Parses a trace.
pub fn parse(text: &str) -> Result<Vec<TraceOp>, TraceError> {
    let mut ops = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |reason: String| TraceError { line: i + 1, reason };
        let (a, b) = line
            .split_once(',')
            .ok_or_else(|| err(format!("expected offset,length, got '{line}'")))?;
        let offset = a.trim().parse().map_err(|e| err(format!("offset '{}': {e}", a.trim())))?;
        let len: u32 = b.trim().parse().map_err(|e| err(format!("length '{}': {e}", b.trim())))?;
        if len == 0 {
            return Err(err("length 0".into()));
        }
        ops.push(TraceOp { offset, len });
    }
    Ok(ops)
}

/// Writes a trace in the format [`parse`] reads.
pub fn format(ops: &[TraceOp]) -> String {
    let mut s = String::from("# offset,length\n");
    for o in ops {
        s.push_str(&format!("{},{}\n", o.offset, o.len));
    }
    s
}

/// A trace shaped like TPC-H Q3 on a database of `file_len` bytes in `page`-byte pages:
/// a full scan of CUSTOMER, then ORDERS scanned page by page while, for the orders that
/// pass the date filter (about half of the pages), the LINEITEM index is probed (a leaf
/// page) and the matching LINEITEM pages read (one to four, at random places). Table
/// sizes follow TPC-H's proportions (customer : orders : lineitem ≈ 1 : 6.5 : 30, by
/// bytes); the index takes a tenth of the file. At most `max_ops` reads.
pub fn tpch_q3(file_len: u64, page: u32, max_ops: usize, seed: u64) -> Vec<TraceOp> {
    let pages = file_len / u64::from(page);
    assert!(pages >= 40, "a Q3 trace needs a file of at least 40 pages");
    let index = pages / 10;
    let data = pages - index;
    let customer = (data / 38).max(1);
    let orders = (data * 65 / 380).max(1);
    let lineitem = data - customer - orders;
    let (c0, o0, l0, i0) = (0, customer, customer + orders, data);
    let at = |p: u64| TraceOp { offset: p * u64::from(page), len: page };
    let mut rng = Rng::new(seed);
    let mut ops = Vec::new();
    for p in c0..c0 + customer {
        ops.push(at(p));
    }
    for p in o0..o0 + orders {
        if ops.len() >= max_ops {
            break;
        }
        ops.push(at(p));
        if rng.below(2) == 0 {
            for _ in 0..1 + rng.below(4) {
                ops.push(at(i0 + rng.below(index)));
                ops.push(at(l0 + rng.below(lineitem)));
            }
        }
    }
    ops.truncate(max_ops);
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let ops = vec![TraceOp { offset: 0, len: 512 }, TraceOp { offset: 1 << 33, len: 16384 }];
        assert_eq!(parse(&format(&ops)).unwrap(), ops);
        assert_eq!(parse("# c\n\n 5 , 7 # x\n").unwrap(), vec![TraceOp { offset: 5, len: 7 }]);
        assert_eq!(parse("1,2\nx,3\n").unwrap_err().line, 2);
        assert!(parse("1\n").is_err());
        assert!(parse("1,0\n").is_err());
    }

    #[test]
    fn q3_trace_stays_inside_the_file_and_mixes_scans_and_probes() {
        let len = 64 << 20;
        let ops = tpch_q3(len, 16384, 100_000, 1);
        assert!(ops.iter().all(|o| o.offset + u64::from(o.len) <= len && o.len == 16384));
        let sequential = ops.windows(2).filter(|w| w[1].offset == w[0].offset + 16384).count();
        assert!(sequential > ops.len() / 10, "scans: {sequential} of {}", ops.len());
        assert!(sequential < ops.len() * 4 / 5, "probes are missing");
        assert_eq!(ops, tpch_q3(len, 16384, 100_000, 1), "same seed, same trace");
    }
}
