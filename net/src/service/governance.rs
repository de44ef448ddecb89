//! Revoked certificates and quotas: the handlers behind their RPCs (the service's trait impl calls these).

use cellog_core::quota::Quotas;
use cellog_core::subject::tenant_of;
use cellog_core::{Access, Cell, Command, Outcome, Rejection};
use cellog_proto::v1;
use cellog_raft::storage::Storage;
use tonic::{Request, Response, Status};

use super::{CellogService, cluster_admin, unexpected};
use crate::status::invalid_argument;

fn quotas_from_wire(quotas: Option<v1::Quotas>) -> Quotas {
    let quotas = quotas.unwrap_or_default();
    let v1::Quotas { max_streams, max_messages, max_bytes, max_in_flight, max_in_flight_per_subject } = quotas;
    Quotas { max_streams, max_messages, max_bytes, max_in_flight, max_in_flight_per_subject }
}

fn quotas_to_wire(quotas: Quotas) -> v1::Quotas {
    let Quotas { max_streams, max_messages, max_bytes, max_in_flight, max_in_flight_per_subject } = quotas;
    v1::Quotas { max_streams, max_messages, max_bytes, max_in_flight, max_in_flight_per_subject }
}

/// A holder's quotas and what it holds, on the wire (`tenant` `None`: the cell).
fn usage(cell: &Cell, tenant: Option<&str>) -> v1::QuotaUsage {
    let quotas = match tenant {
        Some(tenant) => cell.quotas().of(tenant),
        None => cell.quotas().cell,
    };
    let held = cell.held(tenant);
    v1::QuotaUsage {
        tenant: tenant.unwrap_or_default().to_string(),
        quotas: Some(quotas_to_wire(quotas)),
        streams: held.streams,
        messages: held.messages,
        bytes: held.bytes,
        in_flight: held.in_flight,
    }
}

impl<S: Storage + Clone> CellogService<S> {
    pub(super) async fn revoke_certificate_op(
        &self,
        request: Request<v1::RevokeCertificateRequest>,
    ) -> Result<Response<v1::RevokeCertificateResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let v1::RevokeCertificateRequest { serial, subject, until_ms } = request.into_inner();
        let command = Command::RevokeCertificate { serial: serial.to_vec(), subject, until_ms };
        match self.write(&actor, command).await? {
            Outcome::CertificateRevoked { revoked } => Ok(Response::new(v1::RevokeCertificateResponse { revoked })),
            other => Err(unexpected(&other)),
        }
    }

    pub(super) async fn list_revoked_certificates_op(
        &self,
        request: Request<v1::ListRevokedCertificatesRequest>,
    ) -> Result<Response<v1::ListRevokedCertificatesResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let certificates = self
            .read(&actor, cluster_admin, |cell| {
                Ok(cell
                    .revoked_certificates()
                    .iter()
                    .map(|(serial, revoked)| v1::RevokedCertificate {
                        serial: serial.clone().into(),
                        subject: revoked.subject.clone(),
                        until_ms: revoked.until.0,
                    })
                    .collect())
            })
            .await?;
        Ok(Response::new(v1::ListRevokedCertificatesResponse { certificates }))
    }

    pub(super) async fn grant_mirror_op(
        &self,
        request: Request<v1::GrantMirrorRequest>,
    ) -> Result<Response<v1::GrantMirrorResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let v1::GrantMirrorRequest { principal, streams } = request.into_inner();
        match self.write(&actor, Command::GrantMirror { principal, streams }).await? {
            Outcome::MirrorGranted => Ok(Response::new(v1::GrantMirrorResponse {})),
            other => Err(unexpected(&other)),
        }
    }

    pub(super) async fn set_quotas_op(
        &self,
        request: Request<v1::SetQuotasRequest>,
    ) -> Result<Response<v1::SetQuotasResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let v1::SetQuotasRequest { tenant, quotas } = request.into_inner();
        let quotas = quotas_from_wire(quotas);
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
        match self.write(&actor, Command::SetQuotas { tenant, quotas }).await? {
            Outcome::QuotasSet => Ok(Response::new(v1::SetQuotasResponse {})),
            other => Err(unexpected(&other)),
        }
    }

    pub(super) async fn list_quotas_op(
        &self,
        request: Request<v1::ListQuotasRequest>,
    ) -> Result<Response<v1::ListQuotasResponse>, Status> {
        let actor = self.callers.actor(&request)?;
        let principal = self.principal(&actor)?;
        // A cluster admin sees every holder; a tenant's principal, its own tenant; anyone else is refused.
        let tenant = tenant_of(&principal).map(str::to_string);
        let authorize = |cell: &Cell, principal: &str| match tenant_of(principal) {
            Some(_) => Ok(()),
            None => cell.authorize(principal, &Access::ClusterAdmin),
        };
        let holders = self
            .read(&actor, authorize, |cell| {
                Ok::<_, Rejection>(match &tenant {
                    Some(tenant) => vec![usage(cell, Some(tenant))],
                    None => std::iter::once(usage(cell, None))
                        .chain(cell.quotas().tenants.keys().map(|tenant| usage(cell, Some(tenant))))
                        .collect(),
                })
            })
            .await?;
        Ok(Response::new(v1::ListQuotasResponse { holders }))
    }
}
