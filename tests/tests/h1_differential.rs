//! The HTTP/1.x reader and writer held to hyper's reading of the same bytes
//! (`ingress_wire::differential`), on the fuzz corpus: the request-smuggling and normalisation
//! vectors the proxy's own tests send, the published ones (CL.TE, TE.CL, TE.TE obfuscations,
//! chunk-size and chunk-extension tricks, obs-fold, bare CR and LF), and what the fuzzer found
//! worth keeping. Each input is also checked pipelined behind and in front of an ordinary
//! request, so a disagreement about where a message ends shows up as a different next request;
//! and every head is cut after each of its bytes, which must read as unfinished, so a client
//! that writes a request in pieces is read the same as one that writes it whole.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use ingress_wire::differential::check;
use ingress_wire::request::{self, MAX_HEADERS, RequestParse};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ingress/fuzz/corpus/h1_differential");
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    inputs.sort();
    inputs
}

#[test]
fn the_corpus_reads_the_same_to_hyper() {
    let inputs = corpus();
    assert!(inputs.len() >= 60, "only {} corpus inputs", inputs.len());
    let ordinary = b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut failures = Vec::new();
    for (name, input) in &inputs {
        let mut variants = vec![input.clone(), [&ordinary[..], input].concat()];
        // The same bytes with a request behind them: where the first ends decides the second.
        variants.push([input.as_slice(), b"GET /behind HTTP/1.1\r\nHost: a\r\n\r\n"].concat());
        for variant in variants {
            if let Err(why) = check(&variant) {
                failures.push(format!("{name}: {why}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_cut_of_a_head_reads_as_unfinished() {
    let mut failures = Vec::new();
    for (name, input) in &corpus() {
        let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let head_len = match request::parse(input, &mut storage) {
            RequestParse::Complete(req) => req.head_len,
            _ => continue,
        };
        for cut in 0..head_len {
            let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
            match request::parse(&input[..cut], &mut storage) {
                RequestParse::Partial => {}
                RequestParse::Complete(req) => failures.push(format!(
                    "{name}: complete after {cut} of {head_len} head bytes (head_len {})",
                    req.head_len
                )),
                RequestParse::H2Preface => {
                    failures.push(format!("{name}: an HTTP/2 preface after {cut} bytes"));
                }
                RequestParse::Reject(r) => failures.push(format!(
                    "{name}: refused after {cut} of {head_len} head bytes ({}) but accepted whole",
                    r.reason
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
