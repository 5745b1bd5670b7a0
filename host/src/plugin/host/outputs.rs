//! `outputs`: records a call publishes, held in the store until the call
//! ends. The lane then keeps them only for inputs whose attempt acked (see
//! [`crate::dispatch`]); every refusal is an error value to the guest,
//! never a trap and never a silent drop.

use super::HostState;
use crate::ids::{PartitionKey, StreamName};
use crate::outputs::Output;
use crate::plugin::bindings::{v2, v3};

/// Most outputs one call may publish: ten per record of a full 500-record
/// batch. Bounds what a call holds in host memory (with
/// [`MAX_OUTPUT_BYTES_PER_CALL`]) before the lane hands it on.
pub(crate) const MAX_OUTPUTS_PER_CALL: u32 = 5_000;

/// Most bytes (data and partition keys) one call may publish: 16 MiB,
/// about three full `PutRecords` calls.
pub(crate) const MAX_OUTPUT_BYTES_PER_CALL: u64 = 16 << 20;

/// Kinesis's bound on a partition key, in Unicode scalar values.
const MAX_PARTITION_KEY_CHARS: usize = 256;

/// Kinesis's bound on a record: data and partition key together.
const MAX_RECORD_BYTES: usize = crate::failure::MAX_RECORD_BYTES;

/// The one `publish` of every contract version that has `outputs`: their
/// generated types differ, the rules do not.
macro_rules! outputs_host {
    ($version:ident) => {
        impl $version::outputs::Host for HostState {
    fn publish(
        &mut self,
        input: u32,
        stream: String,
        partition_key: String,
        data: Vec<u8>,
    ) -> Result<(), $version::outputs::PublishError> {
        use $version::outputs::PublishError;
        let inputs = self.call.inputs();
        if input as usize >= inputs {
            return Err(PublishError::NoSuchInput(inputs as u32));
        }
        let stream = StreamName::new(stream);
        if !self.grants.outputs.contains(&stream) {
            return Err(PublishError::NotGranted(stream.to_string()));
        }
        let chars = partition_key.chars().count();
        if chars == 0 || chars > MAX_PARTITION_KEY_CHARS {
            return Err(PublishError::Invalid(format!(
                "a partition key has 1 to {MAX_PARTITION_KEY_CHARS} characters, this one {chars}"
            )));
        }
        let bytes = data.len() + partition_key.len();
        if bytes > MAX_RECORD_BYTES {
            return Err(PublishError::Invalid(format!(
                "a record holds at most {MAX_RECORD_BYTES} bytes of data and partition key, this one {bytes}"
            )));
        }
        if self.outputs.len() >= MAX_OUTPUTS_PER_CALL as usize {
            return Err(PublishError::TooMany(MAX_OUTPUTS_PER_CALL));
        }
        if (self.output_bytes + bytes) as u64 > MAX_OUTPUT_BYTES_PER_CALL {
            return Err(PublishError::TooLarge(MAX_OUTPUT_BYTES_PER_CALL));
        }
        self.output_bytes += bytes;
        self.outputs.push(Output {
            input,
            stream,
            partition_key: PartitionKey::new(partition_key),
            data,
        });
        Ok(())
    }
}
    };
}

outputs_host!(v2);
outputs_host!(v3);
