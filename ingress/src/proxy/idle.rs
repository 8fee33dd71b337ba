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
    /// `limit-connections`: the request counts against its client while its response body
    /// streams, as nginx counts a request until it is finalized.
    _guard: Option<ConnectionGuard>,
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            limit: None,
            sleep: None,
            progressed: false,
            _guard: None,
        }
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
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.progressed = true;
                if let (Some(Ok(frame)), Some((limit, seen, tripped))) = (&frame, &mut this.limit)
                    && let Some(data) = frame.data_ref()
                {
                    *seen = seen.saturating_add(data.len() as u64);
                    if *seen > *limit {
                        tripped.store(true, Ordering::Relaxed);
                        return Poll::Ready(Some(Err(IdleError::TooLarge(*limit))));
                    }
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
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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
}
