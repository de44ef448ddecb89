//! Principals, their tokens and certificates, mirror grants, quotas, and transactional producers' registration.

use cellog_core::quota::Quotas;
use cellog_core::{Command, Outcome};
use cellog_proto::v1;
use tonic::Status;

use super::Write;
use crate::convert::{self, DEFAULT_TRANSACTION_TIMEOUT_MS};
use crate::status::invalid_argument;

impl Write for v1::PutPrincipalRequest {
    type Reply = v1::PutPrincipalResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::PutPrincipal { name: self.name, grants: convert::grants(self.grants.unwrap_or_default()) })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::PrincipalPut { created } => Ok(v1::PutPrincipalResponse { created }),
            other => Err(other),
        }
    }
}

impl Write for v1::DeletePrincipalRequest {
    type Reply = v1::DeletePrincipalResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::DeletePrincipal { name: self.name })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::PrincipalDeleted => Ok(v1::DeletePrincipalResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::AddTokenRequest {
    type Reply = v1::AddTokenResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::AddToken { principal: self.principal, token: convert::token_hash(&self.token_sha256)? })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::TokenAdded => Ok(v1::AddTokenResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::RevokeTokenRequest {
    type Reply = v1::RevokeTokenResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::RevokeToken { token: convert::token_hash(&self.token_sha256)? })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::TokenRevoked => Ok(v1::RevokeTokenResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::RevokeCertificateRequest {
    type Reply = v1::RevokeCertificateResponse;
    fn command(self) -> Result<Command, Status> {
        let v1::RevokeCertificateRequest { serial, subject, until_ms } = self;
        Ok(Command::RevokeCertificate { serial: serial.to_vec(), subject, until_ms })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::CertificateRevoked { revoked } => Ok(v1::RevokeCertificateResponse { revoked }),
            other => Err(other),
        }
    }
}

impl Write for v1::GrantMirrorRequest {
    type Reply = v1::GrantMirrorResponse;
    fn command(self) -> Result<Command, Status> {
        Ok(Command::GrantMirror { principal: self.principal, streams: self.streams })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::MirrorGranted => Ok(v1::GrantMirrorResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::SetQuotasRequest {
    type Reply = v1::SetQuotasResponse;
    fn command(self) -> Result<Command, Status> {
        let v1::SetQuotasRequest { tenant, quotas } = self;
        let v1::Quotas { max_streams, max_messages, max_bytes, max_in_flight, max_in_flight_per_subject } =
            quotas.unwrap_or_default();
        let quotas = Quotas { max_streams, max_messages, max_bytes, max_in_flight, max_in_flight_per_subject };
        let zero = [
            ("max_streams", quotas.max_streams),
            ("max_messages", quotas.max_messages),
            ("max_in_flight", quotas.max_in_flight),
            ("max_in_flight_per_subject", quotas.max_in_flight_per_subject.map(u64::from)),
        ];
        for (what, limit) in zero {
            if limit == Some(0) {
                return Err(invalid_argument(format!("{what} of 0 would refuse everything; leave it out for none")));
            }
        }
        let tenant = (!tenant.is_empty()).then_some(tenant);
        Ok(Command::SetQuotas { tenant, quotas })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::QuotasSet => Ok(v1::SetQuotasResponse {}),
            other => Err(other),
        }
    }
}

impl Write for v1::InitProducerRequest {
    type Reply = v1::ProducerRef;
    fn command(self) -> Result<Command, Status> {
        let transaction_timeout_ms = match self.transaction_timeout_ms {
            0 => DEFAULT_TRANSACTION_TIMEOUT_MS,
            timeout => timeout,
        };
        Ok(Command::InitProducer { transactional_id: self.transactional_id, transaction_timeout_ms })
    }
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome> {
        match outcome {
            Outcome::ProducerInitialized(producer) => Ok(convert::producer_to_wire(producer)),
            other => Err(other),
        }
    }
}
