//! A body that fails once its peer has sent nothing for a while: the HTTP/2 path's
//! `client_body_timeout` (a client pausing mid-upload) and `proxy_read_timeout` (an upstream
//! pausing mid-response). The timer only starts while the body is waiting, and is re-armed, not
//! re-created, after each frame.

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::rate_limit::ConnectionGuard;
use crate::snapshot::annotations::rate_limit::Bandwidth;

type BoxError = Box<dyn StdError + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    #[error("nothing received for {0:?}")]
    Timeout(Duration),
    /// A request body grew past `proxy-body-size` (see [`IdleBody::limited`]).
    #[error("request body larger than {0} bytes")]
    TooLarge(u64),
    #[error(transparent)]
    Body(BoxError),
}

pub struct IdleBody<B> {
    inner: B,
    timeout: Duration,
    /// `proxy-body-size`: the limit, the bytes so far, and where tripping it is recorded (the
    /// error itself reaches the caller only as an upstream failure).
    limit: Option<(u64, u64, Arc<AtomicBool>)>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// A frame arrived since the timer was last armed.
    progressed: bool,
    /// Told how many data bytes passed when the body is dropped (done, failed or reset): the
    /// HTTP/2 path's access log line, written when the response has really ended.
    on_end: Option<(u64, OnEnd)>,
    /// `limit-connections`: the request counts against its client while its response body
    /// streams, as nginx counts a request until it is finalized.
    _guard: Option<ConnectionGuard>,
    /// `limit-rate`: the pace, when the body began, the bytes so far, and the pause due
    /// before the next frame.
    throttle: Option<Throttle>,
}

struct Throttle {
    bandwidth: Bandwidth,
    started: Instant,
    sent: u64,
    pause: Option<Pin<Box<Sleep>>>,
    /// What is left of a frame larger than [`PACED_FRAME`].
    rest: Bytes,
}

/// A paced body is sent in frames of at most this size, so a large upstream frame is spread
/// out too.
const PACED_FRAME: usize = 16 * 1024;

impl Throttle {
    /// The next paced piece of `rest`, scheduling the pause that follows it.
    fn next_piece(&mut self) -> Bytes {
        let piece = self.rest.split_to(self.rest.len().min(PACED_FRAME));
        self.sent = self.sent.saturating_add(piece.len() as u64);
        let elapsed = Instant::now().saturating_duration_since(self.started);
        self.pause = self
            .bandwidth
            .delay(self.sent, elapsed)
            .map(|d| Box::pin(tokio::time::sleep(d)));
        piece
    }
}

/// See [`IdleBody::on_end`].
pub type OnEnd = Box<dyn FnOnce(u64) + Send + Sync>;

impl<B> IdleBody<B> {
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            limit: None,
            sleep: None,
            progressed: false,
            on_end: None,
            _guard: None,
            throttle: None,
        }
    }

    /// Calls `f` with the data bytes passed on, once, when the body is dropped.
    pub fn on_end(&mut self, f: OnEnd) {
        self.on_end = Some((0, f));
    }

    /// Sends at most at `bandwidth`'s pace (`limit-rate`), as nginx schedules it. For response
    /// bodies: a paced body is not [`limited`](Self::limited) too (the limit would see only the
    /// first piece of each frame).
    pub fn paced(mut self, bandwidth: Option<Bandwidth>) -> Self {
        self.throttle = bandwidth.map(|bandwidth| Throttle {
            bandwidth,
            started: Instant::now(),
            sent: 0,
            pause: None,
            rest: Bytes::new(),
        });
        self
    }

    /// Holds `guard` until the body is dropped.
    pub fn holding(mut self, guard: Option<ConnectionGuard>) -> Self {
        self._guard = guard;
        self
    }

    /// Also fails once more than `limit` bytes of data have passed, setting `tripped`.
    pub fn limited(mut self, limit: u64, tripped: Arc<AtomicBool>) -> Self {
        self.limit = Some((limit, 0, tripped));
        self
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = IdleError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, IdleError>>> {
        let this = &mut *self;
        if let Some(throttle) = &mut this.throttle
            && let Some(pause) = &mut throttle.pause
        {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            throttle.pause = None;
        }
        if let Some(throttle) = &mut this.throttle
            && !throttle.rest.is_empty()
        {
            let piece = throttle.next_piece();
            if let Some((passed, _)) = &mut this.on_end {
                *passed = passed.saturating_add(piece.len() as u64);
            }
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.progressed = true;
                let frame = match (frame, &mut this.throttle) {
                    (Some(Ok(frame)), Some(throttle)) if frame.is_data() => {
                        match frame.into_data() {
                            Ok(data) => {
                                throttle.rest = data;
                                Some(Ok(Frame::data(throttle.next_piece())))
                            }
                            Err(frame) => Some(Ok(frame)),
                        }
                    }
                    (frame, _) => frame,
                };
                if let (Some(Ok(frame)), Some((limit, seen, tripped))) = (&frame, &mut this.limit)
                    && let Some(data) = frame.data_ref()
                {
                    *seen = seen.saturating_add(data.len() as u64);
                    if *seen > *limit {
                        tripped.store(true, Ordering::Relaxed);
                        return Poll::Ready(Some(Err(IdleError::TooLarge(*limit))));
                    }
                }
                if let (Some(Ok(frame)), Some((passed, _))) = (&frame, &mut this.on_end)
                    && let Some(data) = frame.data_ref()
                {
                    *passed = passed.saturating_add(data.len() as u64);
                }
                Poll::Ready(frame.map(|f| f.map_err(|e| IdleError::Body(e.into()))))
            }
            Poll::Pending => {
                let deadline = Instant::now() + this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if std::mem::take(&mut this.progressed) {
                    sleep.as_mut().reset(deadline);
                }
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(IdleError::Timeout(this.timeout)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // A pause after the last piece paces nothing: only a piece still to send delays the end.
        let paced = self.throttle.as_ref().is_some_and(|t| !t.rest.is_empty());
        !paced && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for IdleBody<B> {
    fn drop(&mut self) {
        if let Some((passed, f)) = self.on_end.take() {
            f(passed);
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// A body that yields one frame, then never another.
    struct Stalls(bool);

    impl Body for Stalls {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if std::mem::take(&mut self.0) {
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
            } else {
                Poll::Pending
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_after_the_timeout() {
        let mut body = IdleBody::new(Stalls(true), Duration::from_secs(5));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "x");
        let started = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(matches!(err, IdleError::Timeout(_)), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_limited_body_fails_past_its_limit_and_says_so() {
        let chunks = || {
            http_body_util::StreamBody::new(futures_util::stream::iter(
                ["abcd", "efgh", "ij"]
                    .map(|s| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(s)))),
            ))
        };
        // (limit, bytes read before the error, or None when the whole body passes)
        for (limit, fails_after) in [(10, None), (9, Some(8)), (4, Some(4)), (0, Some(0))] {
            let tripped = Arc::new(AtomicBool::new(false));
            let mut body =
                IdleBody::new(chunks(), Duration::from_secs(5)).limited(limit, tripped.clone());
            let mut read = 0;
            let mut failed = None;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(frame) => read += frame.into_data().map_or(0, |d| d.len()),
                    Err(err) => {
                        assert!(matches!(err, IdleError::TooLarge(l) if l == limit), "{err}");
                        failed = Some(read);
                        break;
                    }
                }
            }
            assert_eq!(failed, fails_after, "limit {limit}");
            assert_eq!(
                tripped.load(Ordering::Relaxed),
                fails_after.is_some(),
                "limit {limit}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_body_is_split_and_spread_out() {
        let one_frame = http_body_util::Full::new(Bytes::from(vec![b'x'; 64 * 1024]));
        // 16 KiB/s after the first 16 KiB, with nginx's one second of allowance: the 64 KiB
        // end 2 s after the first second.
        let bandwidth = Bandwidth {
            rate: 16 * 1024,
            after: 16 * 1024,
        };
        let mut body = IdleBody::new(one_frame, Duration::from_secs(60)).paced(Some(bandwidth));
        let started = Instant::now();
        let mut pieces = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            pieces.push((data.len(), started.elapsed().as_secs()));
        }
        let kib = 16 * 1024;
        assert_eq!(pieces, [(kib, 0), (kib, 0), (kib, 0), (kib, 1)]);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }
}
