//! `cellog.v1.Mail` over a node's cell: sending, delivery status, delivery from other cells, and the inbox.

use std::sync::Arc;

use cellog_client::status::failed;
use cellog_proto::v1::{self, mail_server::Mail};
use tonic::{Code, Request, Response, Status};

use crate::cell::{MailCell, Need};
use crate::room::Mailroom;
use crate::schema::{INBOX, OUTBOX, RESULTS};

/// How many inbox messages a `ReadMail` answers when the request does not say (at most the cell's read limit).
const DEFAULT_READ_MAIL: usize = 100;

/// The mail API of a node; without a mailroom (no cell key) every call answers NO_CELL_KEY.
pub struct MailService<C> {
    cell: Arc<C>,
    mail: Option<Arc<Mailroom>>,
}

impl<C> Clone for MailService<C> {
    fn clone(&self) -> Self {
        MailService { cell: self.cell.clone(), mail: self.mail.clone() }
    }
}

impl<C: MailCell> MailService<C> {
    /// The mail API of `cell`, served by `mail` when this node has one.
    pub fn new(cell: Arc<C>, mail: Option<Arc<Mailroom>>) -> Self {
        MailService { cell, mail }
    }

    fn mailroom(&self) -> Result<&Mailroom, Status> {
        self.mail.as_deref().ok_or_else(|| {
            failed(
                Code::FailedPrecondition,
                "NO_CELL_KEY",
                "this node has no cell key, so it neither sends nor receives sealed mail",
            )
        })
    }
}

#[tonic::async_trait]
impl<C: MailCell> Mail for MailService<C> {
    async fn send_sealed(
        &self,
        request: Request<v1::SendSealedRequest>,
    ) -> Result<Response<v1::SendSealedResponse>, Status> {
        let principal = self.cell.authorize(&request, Need::Write(OUTBOX))?;
        Ok(Response::new(self.mailroom()?.send(&*self.cell, &principal, request.into_inner()).await?))
    }

    async fn delivery_status(
        &self,
        request: Request<v1::DeliveryStatusRequest>,
    ) -> Result<Response<v1::DeliveryStatusResponse>, Status> {
        let mail = self.mailroom()?;
        self.cell.read_barrier().await?;
        let principal = self.cell.authorize(&request, Need::Read(RESULTS))?;
        Ok(Response::new(mail.status(&*self.cell, &principal, &request.into_inner().envelope_id)?))
    }

    /// Another cell's delivery: taken on the envelope's signature by a key in this cell's keyring, not on a credential.
    async fn deliver(&self, request: Request<v1::DeliverRequest>) -> Result<Response<v1::DeliverResponse>, Status> {
        Ok(Response::new(self.mailroom()?.receive(&*self.cell, request.into_inner().envelope).await?))
    }

    async fn read_mail(&self, request: Request<v1::ReadMailRequest>) -> Result<Response<v1::ReadMailResponse>, Status> {
        let mail = self.mailroom()?;
        self.cell.read_barrier().await?;
        let principal = self.cell.authorize(&request, Need::Read(INBOX))?;
        let request = request.into_inner();
        let max = match request.max {
            0 => DEFAULT_READ_MAIL,
            max => (max as usize).min(cellog_core::MAX_READ),
        };
        Ok(Response::new(mail.read(&*self.cell, &principal, request.from_seq, max)?))
    }
}
