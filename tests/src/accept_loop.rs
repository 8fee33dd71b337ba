//! The accept loop the test upstreams (`upstream`, `https_upstream`, `h2c_upstream`, `otlp`)
//! run: a runtime of their own on a thread of their own, so that a test with no runtime, or one
//! whose runtime is busy, still gets answers; every accepted connection served in a task of its
//! own by the upstream's code; and, when the handle drops, the loop stopped and the thread
//! joined, so no upstream outlives its test.

use std::future::Future;
use std::net::TcpListener;

use tokio::sync::oneshot;

/// A running accept loop. Stops when dropped.
pub struct AcceptLoop {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AcceptLoop {
    /// Accepts on `listener` until dropped. `accept` is called in the loop for each connection
    /// (so what it counts is counted before the next accept) and the future it returns serves
    /// that connection in a task of its own.
    pub fn start<F, Fut>(listener: TcpListener, mut accept: F) -> AcceptLoop
    where
        F: FnMut(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        listener.set_nonblocking(true).expect("nonblocking");
        let (stop, mut stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("upstream runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                loop {
                    let (stream, _) = tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => match accepted {
                            Ok(pair) => pair,
                            Err(_) => continue,
                        },
                    };
                    tokio::spawn(accept(stream));
                }
            });
        });
        AcceptLoop {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for AcceptLoop {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
