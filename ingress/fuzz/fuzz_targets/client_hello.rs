//! Arbitrary bytes through framing, the incremental peek and the parser: nothing may panic, and
//! the three must never contradict one another.
#![no_main]

use libfuzzer_sys::fuzz_target;

use ingress_client_hello::{
    Framing, MAX_NAME_LEN, MAX_RECORD_LEN, Peek, gate, parse, peek, record_len,
};

fuzz_target!(|data: &[u8]| {
    let peeked = peek(data);
    match (record_len(data), &peeked) {
        (Framing::NeedMore(n), Peek::NeedMore(m)) => {
            assert!(n == *m && n > data.len() && n <= MAX_RECORD_LEN);
            assert!(parse(data).is_err());
        }
        (Framing::Reject(r), Peek::Done(Err(e))) => {
            assert_eq!(r, *e);
            assert_eq!(parse(data), Err(r));
        }
        (Framing::Complete(n), Peek::Done(result)) => {
            assert!(n <= data.len() && n <= MAX_RECORD_LEN);
            let record = &data[..n];
            assert_eq!(&parse(record), result);
            if let Ok(hello) = result {
                assert_eq!(hello.record_len, n);
                let _ = hello.offers_tls13();
                if let Some(name) = &hello.server_name {
                    assert!(!name.is_empty() && name.len() <= MAX_NAME_LEN);
                    assert!(name.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)
                    }));
                    assert!(!name.starts_with('.') && !name.ends_with('.') && !name.contains(".."));
                }
                for protocol in hello.alpn.iter().flat_map(|l| l.iter()) {
                    assert!(!protocol.is_empty());
                }
            }
            let _ = gate(result);
        }
        other => panic!("framing and peek disagree: {other:?}"),
    }

    // More bytes never change a verdict already given: the proxy may decide on a partial read.
    for cut in [data.len() / 3, data.len() / 2, 2 * data.len() / 3] {
        if let Peek::Done(early) = peek(&data[..cut]) {
            assert_eq!(Peek::Done(early), peeked);
        }
    }
});
