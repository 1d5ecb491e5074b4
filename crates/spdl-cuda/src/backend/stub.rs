//! The backend without the `cuda` feature: no driver, and every handle type is uninhabited, so the public types
//! built on them can never be constructed and their methods are statically unreachable.

use std::ptr::NonNull;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::tracker::CopyEvent;

pub(crate) fn device_count() -> Result<usize> {
    Err(Error::NotCompiled)
}

#[derive(Debug, Clone)]
pub(crate) enum Context {}

impl Context {
    pub(crate) fn open(_index: usize) -> Result<Context> {
        Err(Error::NotCompiled)
    }
    pub(crate) fn index(&self) -> usize {
        match *self {}
    }
    pub(crate) fn name(&self) -> Result<String> {
        match *self {}
    }
    pub(crate) fn total_memory(&self) -> Result<usize> {
        match *self {}
    }
    pub(crate) fn compute_capability(&self) -> Result<(i32, i32)> {
        match *self {}
    }
    pub(crate) fn synchronize(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn retain_freed_memory(&self, _bytes: u64) -> Result<()> {
        match *self {}
    }
    pub(crate) fn new_stream(&self) -> Result<RawStream> {
        match *self {}
    }
    /// # Safety
    /// Never callable: `Context` is uninhabited here.
    pub(crate) unsafe fn borrow_stream(&self, _handle: usize) -> RawStream {
        match *self {}
    }
    pub(crate) fn alloc_host(&self, _size: usize) -> Result<NonNull<u8>> {
        match *self {}
    }
    /// # Safety
    /// Never callable: `Context` is uninhabited here.
    pub(crate) unsafe fn free_host(&self, _ptr: NonNull<u8>) -> Result<()> {
        match *self {}
    }
}

#[derive(Debug, Clone)]
pub(crate) enum RawStream {}

impl RawStream {
    pub(crate) fn context(&self) -> &Context {
        match *self {}
    }
    pub(crate) fn handle(&self) -> usize {
        match *self {}
    }
    pub(crate) fn record(&self) -> Result<Event> {
        match *self {}
    }
    pub(crate) fn wait(&self, _event: &Event) -> Result<()> {
        match *self {}
    }
    pub(crate) fn synchronize(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn alloc(&self, _bytes: usize) -> Result<DeviceMem> {
        match *self {}
    }
    /// # Safety
    /// Never callable: `RawStream` is uninhabited here.
    pub(crate) unsafe fn copy_htod(&self, _dst: u64, _src: &[u8]) -> Result<()> {
        match *self {}
    }
    /// # Safety
    /// Never callable: `RawStream` is uninhabited here.
    pub(crate) unsafe fn copy_dtoh_blocking(&self, _dst: &mut [u8], _src: u64) -> Result<()> {
        match *self {}
    }
}

#[derive(Debug)]
pub(crate) enum Event {}

impl CopyEvent for Event {
    fn query(&self) -> Result<bool> {
        match *self {}
    }
    fn wait(&self) -> Result<()> {
        match *self {}
    }
    fn elapsed_since(&self, _start: &Self) -> Result<Duration> {
        match *self {}
    }
}

#[derive(Debug)]
pub(crate) enum DeviceMem {}

impl DeviceMem {
    pub(crate) fn ptr(&self) -> u64 {
        match *self {}
    }
    pub(crate) fn stream(&self) -> &RawStream {
        match *self {}
    }
    pub(crate) fn add_user(&self, _s: &RawStream) {
        match *self {}
    }
    pub(crate) fn users(&self) -> Vec<RawStream> {
        match *self {}
    }
}
