//! A body that fails once its peer has sent nothing for a while: the HTTP/2 path's
//! `client_body_timeout` (a client pausing mid-upload) and `proxy_read_timeout` (an upstream
//! pausing mid-response). The timer only starts while the body is waiting, and is re-armed, not
//! re-created, after each frame.

use std::error::Error as StdError;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn StdError + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    #[error("nothing received for {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Body(BoxError),
}

pub struct IdleBody<B> {
    inner: B,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    /// A frame arrived since the timer was last armed.
    progressed: bool,
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            sleep: None,
            progressed: false,
        }
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
}
