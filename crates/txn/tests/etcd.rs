//! The etcd configuration store against a real etcd (Debian's `etcd-server`), which each
//! test starts on 127.0.0.1 with a data directory of its own and stops. Without an `etcd`
//! binary the tests say so and pass, unless `HYTRA_REQUIRE_ETCD=1` (CI sets it), which
//! makes a missing etcd a failure.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Barrier};

use hytra_txn::config_store::etcd::{EtcdStore, LocalEtcd};
use hytra_txn::config_store::{Cas, ConfigStore};

fn etcd(name: &str) -> Option<LocalEtcd> {
    let e = LocalEtcd::start(name).unwrap();
    if e.is_none() {
        eprintln!("no etcd binary (Debian: etcd-server): {name} not run");
    }
    e
}

#[test]
fn only_the_expected_epoch_is_replaced_in_etcd() {
    let Some(e) = etcd("cas") else { return };
    let a = EtcdStore::new(vec![e.client], "/hytra-test/cas").unwrap();
    let b = a.clone();
    assert_eq!(a.get(), Ok(None));
    assert_eq!(a.cas(0, 1, b"one"), Ok(Cas::Done));
    assert_eq!(b.cas(0, 1, b"other"), Ok(Cas::Lost(1, b"one".to_vec())));
    assert_eq!(b.cas(1, 2, b""), Ok(Cas::Done), "an empty configuration is stored too");
    assert_eq!(a.cas(1, 2, b"late"), Ok(Cas::Lost(2, Vec::new())));
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(a.cas(2, 3, &big), Ok(Cas::Done));
    assert_eq!(b.get(), Ok(Some((3, big))));
    // Another run's prefix is a store of its own.
    let other = EtcdStore::new(vec![e.client], "/hytra-test/cas2").unwrap();
    assert_eq!(other.get(), Ok(None));
    assert_eq!(other.cas(0, 1, b"x"), Ok(Cas::Done));
    assert_eq!(e.keys_under("/hytra-test/"), Ok(4));
    a.clear().unwrap();
    assert_eq!(b.get(), Ok(None), "cleared");
    assert_eq!(e.keys_under("/hytra-test/"), Ok(2), "the other run's keys stay");
}

/// Managers racing for each epoch from many threads: exactly one wins each, and every
/// loser learns the winner's configuration.
#[test]
fn of_racing_managers_exactly_one_moves_each_epoch() {
    let Some(e) = etcd("race") else { return };
    const THREADS: usize = 6;
    const EPOCHS: u64 = 15;
    let store = EtcdStore::new(vec![e.client], "/hytra-test/race").unwrap();
    assert_eq!(store.cas(0, 1, b"start"), Ok(Cas::Done));
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (store, barrier) = (store.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut wins = Vec::new();
                for epoch in 1..=EPOCHS {
                    barrier.wait();
                    let mine = format!("{t}@{epoch}").into_bytes();
                    match store.cas(epoch, epoch + 1, &mine).unwrap() {
                        Cas::Done => wins.push(epoch + 1),
                        Cas::Lost(e, winner) => {
                            assert_eq!(e, epoch + 1, "lost to the same epoch's winner");
                            assert_ne!(winner, mine);
                        }
                    }
                }
                wins
            })
        })
        .collect();
    let mut wins: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    wins.sort_unstable();
    assert_eq!(wins, (2..=EPOCHS + 1).collect::<Vec<_>>(), "one winner per epoch");
    let (epoch, _) = store.get().unwrap().unwrap();
    assert_eq!(epoch, EPOCHS + 1);
}

#[test]
fn a_stopped_etcd_is_unavailable_and_a_second_endpoint_is_tried() {
    let Some(mut e) = etcd("stop") else { return };
    let dead: SocketAddr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let store = EtcdStore::new(vec![dead, e.client], "/hytra-test/stop").unwrap();
    assert_eq!(store.cas(0, 1, b"one"), Ok(Cas::Done), "the live endpoint answered");
    e.kill();
    let err = store.get().unwrap_err().to_string();
    assert!(err.contains("unavailable") && err.contains(&dead.to_string()), "{err}");
}

/// The first endpoint commits the compare-and-set but its answer is lost (a proxy that
/// passes the request on and drops the reply); the second endpoint then finds exactly this
/// configuration stored, which is this manager's commit, not another's.
#[test]
fn a_commit_whose_answer_was_lost_is_still_this_managers() {
    use std::io::{Read, Write};
    let Some(e) = etcd("lost") else { return };
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let via = proxy.local_addr().unwrap();
    let etcd_at = e.client;
    let relay = std::thread::spawn(move || {
        let (mut from, _) = proxy.accept().unwrap();
        from.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        // The whole request: headers, then Content-Length bytes of body.
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = from.read(&mut buf).unwrap();
            assert!(n > 0, "the request ended early");
            req.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&req).into_owned();
            if let Some(at) = text.find("\r\n\r\n") {
                let len: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                if req.len() >= at + 4 + len {
                    break;
                }
            }
        }
        let mut to = std::net::TcpStream::connect(etcd_at).unwrap();
        to.write_all(&req).unwrap();
        let mut answer = Vec::new();
        to.read_to_end(&mut answer).unwrap();
        assert!(String::from_utf8_lossy(&answer).contains("\"succeeded\":true"));
        // Dropped without a word back.
    });
    let store = EtcdStore::new(vec![via, e.client], "/hytra-test/lost").unwrap();
    assert_eq!(store.cas(0, 1, b"mine"), Ok(Cas::Done));
    relay.join().unwrap();
    assert_eq!(store.get(), Ok(Some((1, b"mine".to_vec()))));
    // Without a failed endpoint before it, the same finding is another manager's.
    let direct = EtcdStore::new(vec![e.client], "/hytra-test/lost").unwrap();
    assert_eq!(direct.cas(0, 1, b"mine"), Ok(Cas::Lost(1, b"mine".to_vec())));
}
