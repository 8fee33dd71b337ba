//! A cursor over untrusted bytes: every read is checked, so a short buffer is a `None`, never a
//! panic.

pub(super) struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Self(buf)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.0.split_at_checked(n)?;
        self.0 = tail;
        Some(head)
    }

    pub(super) fn u8(&mut self) -> Option<u8> {
        let (&b, tail) = self.0.split_first()?;
        self.0 = tail;
        Some(b)
    }

    pub(super) fn u16(&mut self) -> Option<u16> {
        match *self.take(2)? {
            [hi, lo] => Some(u16::from_be_bytes([hi, lo])),
            _ => None,
        }
    }

    pub(super) fn u24(&mut self) -> Option<usize> {
        match *self.take(3)? {
            [a, b, c] => Some(usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c)),
            _ => None,
        }
    }

    /// A vector with a one-byte length prefix.
    pub(super) fn vec_u8(&mut self) -> Option<&'a [u8]> {
        let len = self.u8()?;
        self.take(usize::from(len))
    }

    /// A vector with a two-byte length prefix.
    pub(super) fn vec_u16(&mut self) -> Option<&'a [u8]> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }
}
