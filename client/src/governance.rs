//! Revoked certificates and quotas, from a client: what a cluster admin sets, and what a tenant may read of its own.

use bytes::Bytes;
use cellog_proto::v1;

use crate::client::{Client, ClientError};

impl Client {
    /// Revokes the certificate with `serial` (its DER bytes), which names `subject` and ends at `until_ms`
    /// (milliseconds since the epoch). Returns false when it already was revoked.
    pub async fn revoke_certificate(&self, serial: &[u8], subject: &str, until_ms: u64) -> Result<bool, ClientError> {
        let request = v1::RevokeCertificateRequest {
            serial: Bytes::copy_from_slice(serial),
            subject: subject.to_string(),
            until_ms,
        };
        let response = self.call(true, request, |mut c, r| async move { c.revoke_certificate(r).await }).await?;
        Ok(response.revoked)
    }

    /// The revoked certificates the cell remembers (until each ends).
    pub async fn revoked_certificates(&self) -> Result<Vec<v1::RevokedCertificate>, ClientError> {
        let request = v1::ListRevokedCertificatesRequest {};
        let response = self.call(true, request, |mut c, r| async move { c.list_revoked_certificates(r).await }).await?;
        Ok(response.certificates)
    }

    /// Replaces the streams (stored names) `principal` may mirror; none takes the grant away. Cluster admin.
    pub async fn grant_mirror(&self, principal: &str, streams: &[String]) -> Result<(), ClientError> {
        let request = v1::GrantMirrorRequest { principal: principal.to_string(), streams: streams.to_vec() };
        self.call(true, request, |mut c, r| async move { c.grant_mirror(r).await }).await?;
        Ok(())
    }

    /// Sets `tenant`'s quotas (the cell's own with `None`); limits left `None` are unlimited.
    pub async fn set_quotas(&self, tenant: Option<&str>, quotas: v1::Quotas) -> Result<(), ClientError> {
        let request = v1::SetQuotasRequest { tenant: tenant.unwrap_or_default().to_string(), quotas: Some(quotas) };
        self.call(true, request, |mut c, r| async move { c.set_quotas(r).await }).await?;
        Ok(())
    }

    /// The quotas the caller may see and what each holder holds: every holder for a cluster admin (the cell first),
    /// a tenant's own for its principals.
    pub async fn quotas(&self) -> Result<Vec<v1::QuotaUsage>, ClientError> {
        let response =
            self.call(true, v1::ListQuotasRequest {}, |mut c, r| async move { c.list_quotas(r).await }).await?;
        Ok(response.holders)
    }
}
