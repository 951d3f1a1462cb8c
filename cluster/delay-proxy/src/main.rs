//! `holdfast-delay-proxy DELAY_US LISTEN=TARGET ...`: accepts TCP connections on each LISTEN address and
//! joins each to a new connection to its TARGET, delivering every chunk read on one side `DELAY_US`
//! microseconds after it was read, in order, in both directions: a link whose one-way delay is that long.
//!
//! Each direction of each connection has a reader thread, which stamps what it reads, and a writer thread,
//! which sleeps until the stamp plus the delay and writes; so a chunk's wait does not hold back the reading
//! of the next, and the link carries as much as TCP on loopback does. Threads sleep with the kernel's
//! timer slack set to 1 µs, so the delay is kept to within tens of microseconds. Runs until killed.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: holdfast-delay-proxy DELAY_US LISTEN=TARGET [LISTEN=TARGET ...]";
    let delay: u64 = args.next().and_then(|d| d.parse().ok()).unwrap_or_else(|| fail(usage));
    let delay = Duration::from_micros(delay);
    let links: Vec<(String, String)> = args
        .map(|arg| match arg.split_once('=') {
            Some((listen, target)) => (listen.to_owned(), target.to_owned()),
            None => fail(usage),
        })
        .collect();
    if links.is_empty() {
        fail(usage);
    }
    let mut threads = Vec::new();
    for (listen, target) in links {
        let listener = TcpListener::bind(&listen).unwrap_or_else(|e| fail(&format!("bind {listen}: {e}")));
        threads.push(std::thread::spawn(move || serve(listener, target, delay)));
    }
    for thread in threads {
        let _ = thread.join();
    }
}

fn fail(why: &str) -> ! {
    eprintln!("holdfast-delay-proxy: {why}");
    std::process::exit(2)
}

fn serve(listener: TcpListener, target: String, delay: Duration) {
    for incoming in listener.incoming() {
        let Ok(client) = incoming else { continue };
        let target = target.clone();
        std::thread::spawn(move || {
            let Ok(upstream) = TcpStream::connect(&target) else { return };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else { return };
            pump(client, upstream, delay);
            pump(upstream2, client2, delay);
        });
    }
}

/// Carries what `from` sends to `to`, each chunk `delay` after it was read; shuts `to`'s writing down when
/// `from` ends.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, delayed) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        set_timer_slack();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if chunks.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    std::thread::spawn(move || {
        set_timer_slack();
        for (due, bytes) in delayed {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// `prctl(PR_SET_TIMERSLACK, 1)`: sleeps end within a microsecond of their due time, not the default 50.
fn set_timer_slack() {
    extern "C" {
        fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
    }
    const PR_SET_TIMERSLACK: i32 = 29;
    // SAFETY: prctl with PR_SET_TIMERSLACK takes integers only and changes the calling thread alone.
    unsafe {
        prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
    }
}
