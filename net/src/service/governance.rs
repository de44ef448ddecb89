//! Reading revoked certificates and quotas: the handlers behind their list RPCs (the service's trait impl calls these;
//! their writes are in the table of [`crate::ops`]).

use cellog_core::quota::Quotas;
use cellog_core::subject::tenant_of;
use cellog_core::{Access, Cell, Rejection};
use cellog_proto::v1;
use cellog_raft::storage::Storage;
use tonic::{Request, Response, Status};

use super::{CellogService, cluster_admin};

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
